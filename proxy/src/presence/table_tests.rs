//! Unit tests of the presence table (split out to keep table.rs short).

use super::*;

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn auth(id: &str) -> Sighting {
    Sighting {
        id: id.into(),
        source: Source::Auth,
    }
}

fn ids(t: &mut Table, now: Instant) -> Vec<String> {
    t.page(None, 1000, now)
        .0
        .into_iter()
        .map(|(id, _, _)| id)
        .collect()
}

const MIN: Duration = Duration::from_secs(60);

#[test]
fn a_minion_is_paired_with_the_publish_session_from_its_address() {
    let t0 = Instant::now();
    let mut t = Table::new(100, MIN);
    t.publish_opened(1, addr("10.0.0.5", 40001), Some("a".into()), t0, 1);
    t.identified(2, addr("10.0.0.5", 40002), "b", &auth("web1"), t0, 2);
    let (page, more) = t.page(None, 10, t0);
    assert!(!more);
    let (id, m, publish) = &page[0];
    assert_eq!(id, "web1");
    assert_eq!(m.request_master, "b");
    assert_eq!(m.client, addr("10.0.0.5", 40002));
    assert_eq!(*publish, PublishOf::Master("a".into()));
    assert_eq!(m.request_sessions, 1);
    assert!(m.gone_since.is_none());
    let c = t.counts(t0);
    assert_eq!((c.known, c.connected, c.publish_ambiguous), (1, 1, 0));
    assert_eq!(c.per_master["a"], [1, 0]);
    assert_eq!(c.per_master["b"], [0, 1]);
}

#[test]
fn several_publish_sessions_on_several_masters_from_one_address_are_ambiguous() {
    let t0 = Instant::now();
    let mut t = Table::new(100, MIN);
    let nat = "192.0.2.9";
    t.publish_opened(1, addr(nat, 1), Some("b".into()), t0, 0);
    t.publish_opened(2, addr(nat, 2), Some("a".into()), t0, 0);
    t.identified(3, addr(nat, 3), "a", &auth("m1"), t0, 0);
    t.identified(4, addr(nat, 4), "b", &auth("m2"), t0, 0);
    assert_eq!(
        t.publish_of(nat.parse().unwrap()),
        PublishOf::Ambiguous(vec!["a".into(), "b".into()])
    );
    assert_eq!(t.counts(t0).publish_ambiguous, 2);
    // One publish session left: the address is unambiguous again (for both minions).
    t.publish_closed(1, addr(nat, 1), t0, 0);
    assert_eq!(
        t.publish_of(nat.parse().unwrap()),
        PublishOf::Master("a".into())
    );
    // All on one master: that master, however many sessions.
    t.publish_opened(5, addr(nat, 5), Some("a".into()), t0, 0);
    assert_eq!(
        t.publish_of(nat.parse().unwrap()),
        PublishOf::Master("a".into())
    );
    t.publish_opened(6, addr("10.1.1.1", 5), None, t0, 0);
    assert_eq!(t.publish_of("10.1.1.1".parse().unwrap()), PublishOf::Fanout);
}

#[test]
fn a_minion_without_sessions_is_listed_until_it_expires() {
    let t0 = Instant::now();
    let mut t = Table::new(100, MIN);
    let c = addr("10.0.0.7", 1);
    t.publish_opened(1, addr("10.0.0.7", 2), Some("a".into()), t0, 0);
    t.identified(2, c, "a", &auth("m"), t0, 1_000);
    // The request session ends: still connected through its publish session.
    t.request_closed(2, t0 + MIN, 2_000);
    assert!(t.get("m").unwrap().gone_since.is_none());
    assert_eq!(t.get("m").unwrap().request_sessions, 0);
    // The publish session ends: gone from now, listed with its last master.
    let t1 = t0 + 2 * MIN;
    t.publish_closed(1, addr("10.0.0.7", 2), t1, 3_000);
    let m = t.get("m").unwrap();
    assert_eq!((m.gone_since, m.last_seen_ms), (Some(t1), 3_000));
    assert_eq!(t.counts(t1).connected, 0);
    assert_eq!(ids(&mut t, t1 + MIN - Duration::from_millis(1)), ["m"]);
    assert!(ids(&mut t, t1 + MIN).is_empty());
    assert!(t.is_empty());
}

#[test]
fn a_minion_that_comes_back_before_expiry_is_connected_again_with_its_first_seen() {
    let t0 = Instant::now();
    let mut t = Table::new(100, MIN);
    t.identified(1, addr("10.0.0.8", 1), "a", &auth("m"), t0, 10);
    t.request_closed(1, t0, 20);
    assert!(t.get("m").unwrap().gone_since.is_some());
    t.identified(2, addr("10.0.0.9", 1), "b", &auth("m"), t0 + MIN / 2, 30);
    let m = t.get("m").unwrap();
    assert!(m.gone_since.is_none());
    assert_eq!((m.first_seen_ms, m.last_seen_ms), (10, 30));
    assert_eq!(m.request_master, "b");
    assert_eq!(m.client.ip().to_string(), "10.0.0.9");
    // Its old address no longer pairs it: a publish session there does not connect it.
    t.request_closed(2, t0 + MIN, 40);
    t.publish_opened(3, addr("10.0.0.8", 9), Some("a".into()), t0 + MIN, 50);
    assert!(t.get("m").unwrap().gone_since.is_some());
    t.publish_opened(4, addr("10.0.0.9", 9), Some("c".into()), t0 + MIN, 60);
    assert!(t.get("m").unwrap().gone_since.is_none());
}

#[test]
fn the_cap_evicts_gone_minions_first_then_the_least_recently_identified() {
    let t0 = Instant::now();
    let mut t = Table::new(3, MIN);
    for (s, id) in [(1, "a"), (2, "b"), (3, "c")] {
        t.identified(s, addr("10.0.0.1", s as u16), "m", &auth(id), t0, 0);
    }
    t.request_closed(2, t0, 0); // b is gone
    t.identified(4, addr("10.0.0.2", 4), "m", &auth("d"), t0, 0);
    assert_eq!(ids(&mut t, t0), ["a", "c", "d"]);
    assert_eq!(t.evicted, 1);
    // Nothing gone: the one identified least recently (a) goes, even though connected.
    t.identified(5, addr("10.0.0.1", 5), "m", &auth("c"), t0, 0);
    t.identified(6, addr("10.0.0.3", 6), "m", &auth("e"), t0, 0);
    assert_eq!(ids(&mut t, t0), ["c", "d", "e"]);
    // The evicted minion's session closing later changes nothing; a new "a" is not affected
    // by it either.
    t.identified(7, addr("10.0.0.4", 7), "m", &auth("a"), t0, 0);
    t.request_closed(1, t0, 0);
    assert_eq!(t.get("a").unwrap().request_sessions, 1);
    assert_eq!(t.len(), 3);
    // A lowered cap applies at once.
    t.max = 1;
    t.shrink_to_cap();
    assert_eq!(t.len(), 1);
}

#[test]
fn pages_follow_ids() {
    let t0 = Instant::now();
    let mut t = Table::new(100, MIN);
    for (s, id) in [(1, "m3"), (2, "m1"), (3, "m2"), (4, "m4")] {
        t.identified(s, addr("10.0.0.1", s as u16), "a", &auth(id), t0, 0);
    }
    let page = |t: &mut Table, after: Option<&str>| {
        let (p, more) = t.page(after, 2, t0);
        (p.into_iter().map(|(id, _, _)| id).collect::<Vec<_>>(), more)
    };
    assert_eq!(page(&mut t, None), (vec!["m1".into(), "m2".into()], true));
    assert_eq!(
        page(&mut t, Some("m2")),
        (vec!["m3".into(), "m4".into()], false)
    );
    assert_eq!(page(&mut t, Some("m4")), (vec![], false));
    assert_eq!(
        page(&mut t, Some("m25")),
        (vec!["m3".into(), "m4".into()], false)
    );
}

#[test]
fn two_request_sessions_of_one_minion_keep_it_connected_until_both_end() {
    let t0 = Instant::now();
    let mut t = Table::new(100, MIN);
    t.identified(1, addr("10.0.0.1", 1), "a", &auth("m"), t0, 0);
    let aes = Sighting {
        id: "m".into(),
        source: Source::Aes,
    };
    t.identified(2, addr("10.0.0.1", 2), "b", &aes, t0, 0);
    let m = t.get("m").unwrap();
    assert_eq!((m.request_sessions, m.source), (2, Source::Aes));
    assert_eq!(m.request_master, "b");
    t.request_closed(1, t0, 0);
    assert!(t.get("m").unwrap().gone_since.is_none());
    t.request_closed(2, t0, 0);
    assert!(t.get("m").unwrap().gone_since.is_some());
    // Closing an unknown or already closed session is harmless.
    t.request_closed(2, t0, 0);
    t.publish_closed(99, addr("10.9.9.9", 1), t0, 0);
}
