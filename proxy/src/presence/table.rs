//! The presence table: minion id → client address, request master, publish sessions from the
//! same address, first and last seen. Plain data, no locking and no clock of its own (every
//! operation is given `now`), so it can be tested step by step.
//!
//! * A minion enters when one of its request sessions is identified ([`Table::identified`]).
//! * It is *connected* while it has an identified request session open, or a publish session is
//!   open from its client IP address (the publish port carries no id: the address is the only
//!   key; see [`PublishOf`]).
//! * Once it has neither, it is *gone*: listed with its last master for `expire_after`, then
//!   removed.
//! * At most `max` minions: adding one more evicts the minion gone longest, or, when none is
//!   gone, the connected one identified least recently.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use saltgate_wire::transport::{Sighting, Source};
use tokio::time::Instant;

/// One listed minion.
#[derive(Debug, Clone)]
pub struct Minion {
    /// The client address of its most recently identified request session.
    pub client: SocketAddr,
    /// The master of that session.
    pub request_master: String,
    /// What the id was read from, last time.
    pub source: Source,
    /// Wall-clock milliseconds since the Unix epoch.
    pub first_seen_ms: u64,
    /// When a request session of it was last identified, or when its last session ended.
    pub last_seen_ms: u64,
    /// Identified request sessions open now.
    pub request_sessions: u32,
    /// Since when it has had no session (`None`: connected).
    pub gone_since: Option<Instant>,
    /// Recency of its last identification (for eviction).
    touch: u64,
    /// Unique per entry: a session of an evicted entry does not count for a new one.
    created: u64,
}

/// What the table knows about a minion's publish session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOf {
    /// No publish session is open from its address.
    None,
    /// Every publish session from its address is on this master (one minion per address: exact).
    Master(String),
    /// The publish listener is in fan-out mode: the session reaches every master that is UP.
    Fanout,
    /// Publish sessions from its address are on several masters (several minions behind one
    /// address, a NAT or a swarm): which is its own cannot be told. The candidates, sorted.
    Ambiguous(Vec<String>),
}

/// A live publish session: its id and master (`None`: fan-out).
#[derive(Debug, Clone)]
struct PubSession {
    session: u64,
    master: Option<Arc<str>>,
}

/// Minions per master, and totals (metrics).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub known: usize,
    pub connected: usize,
    /// Connected minions whose publish master cannot be told.
    pub publish_ambiguous: usize,
    /// Connected minions per master: `[publish, request]`.
    pub per_master: BTreeMap<String, [usize; 2]>,
}

#[derive(Debug)]
pub struct Table {
    pub max: usize,
    pub expire: Duration,
    minions: BTreeMap<String, Minion>,
    /// Identified request sessions: session id → (minion id, entry's `created`).
    requests: HashMap<u64, (String, u64)>,
    /// Live publish sessions by client IP.
    publish: HashMap<IpAddr, Vec<PubSession>>,
    /// Minion ids by the IP of their client address.
    by_ip: HashMap<IpAddr, BTreeSet<String>>,
    /// Gone minions, gone longest first.
    gone: BTreeSet<(Instant, String)>,
    /// Connected minions, identified least recently first.
    live: BTreeSet<(u64, String)>,
    seq: u64,
    /// Minions evicted because the table was full (a metric).
    pub evicted: u64,
}

impl Table {
    pub fn new(max: usize, expire: Duration) -> Self {
        Table {
            max: max.max(1),
            expire,
            minions: BTreeMap::new(),
            requests: HashMap::new(),
            publish: HashMap::new(),
            by_ip: HashMap::new(),
            gone: BTreeSet::new(),
            live: BTreeSet::new(),
            seq: 0,
            evicted: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.minions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.minions.is_empty()
    }

    /// Forgets everything (presence turned off).
    pub fn clear(&mut self) {
        let evicted = self.evicted;
        *self = Table::new(self.max, self.expire);
        self.evicted = evicted;
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Removes the minions gone for `expire` or longer.
    pub fn sweep(&mut self, now: Instant) {
        while let Some((since, _)) = self.gone.first() {
            if now.saturating_duration_since(*since) < self.expire {
                break;
            }
            if let Some((_, id)) = self.gone.pop_first() {
                self.remove(&id);
            }
        }
    }

    /// Evicts until at most `keep` minions are left: those gone longest first, then those
    /// identified least recently.
    fn evict_down_to(&mut self, keep: usize) {
        while self.minions.len() > keep {
            let victim = match self.gone.pop_first() {
                Some((_, id)) => id,
                None => match self.live.pop_first() {
                    Some((_, id)) => id,
                    None => return,
                },
            };
            self.remove(&victim);
            self.evicted += 1;
        }
    }

    /// Applies the cap (after it was lowered).
    pub fn shrink_to_cap(&mut self) {
        self.evict_down_to(self.max);
    }

    fn remove(&mut self, id: &str) {
        let Some(m) = self.minions.remove(id) else {
            return;
        };
        let ip = m.client.ip();
        if let Some(ids) = self.by_ip.get_mut(&ip) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_ip.remove(&ip);
            }
        }
        match m.gone_since {
            Some(t) => self.gone.remove(&(t, id.to_string())),
            None => self.live.remove(&(m.touch, id.to_string())),
        };
    }

    /// Moves `id` between connected and gone as its sessions say.
    fn refresh(&mut self, id: &str, now: Instant, now_ms: u64) {
        let Some(m) = self.minions.get_mut(id) else {
            return;
        };
        let connected = m.request_sessions > 0
            || self
                .publish
                .get(&m.client.ip())
                .is_some_and(|v| !v.is_empty());
        match (connected, m.gone_since) {
            (true, Some(since)) => {
                self.gone.remove(&(since, id.to_string()));
                m.gone_since = None;
                self.live.insert((m.touch, id.to_string()));
            }
            (false, None) => {
                self.live.remove(&(m.touch, id.to_string()));
                m.gone_since = Some(now);
                m.last_seen_ms = now_ms;
                self.gone.insert((now, id.to_string()));
            }
            _ => {}
        }
    }

    /// A request session of `sighting.id` from `client`, on `master`, was identified.
    pub fn identified(
        &mut self,
        session: u64,
        client: SocketAddr,
        master: &str,
        sighting: &Sighting,
        now: Instant,
        now_ms: u64,
    ) {
        self.sweep(now);
        let id = sighting.id.as_str();
        let touch = self.next_seq();
        if !self.minions.contains_key(id) {
            self.evict_down_to(self.max - 1);
            self.minions.insert(
                id.to_string(),
                Minion {
                    client,
                    request_master: master.to_string(),
                    source: sighting.source,
                    first_seen_ms: now_ms,
                    last_seen_ms: now_ms,
                    request_sessions: 0,
                    gone_since: None,
                    touch,
                    created: touch,
                },
            );
            self.live.insert((touch, id.to_string()));
            self.by_ip.entry(client.ip()).or_default().insert(id.into());
        }
        let Some(m) = self.minions.get_mut(id) else {
            return;
        };
        let old_ip = m.client.ip();
        if m.gone_since.is_none() {
            self.live.remove(&(m.touch, id.to_string()));
            self.live.insert((touch, id.to_string()));
        }
        m.touch = touch;
        m.client = client;
        m.request_master = master.to_string();
        m.source = sighting.source;
        m.last_seen_ms = now_ms;
        m.request_sessions += 1;
        let created = m.created;
        if old_ip != client.ip() {
            if let Some(ids) = self.by_ip.get_mut(&old_ip) {
                ids.remove(id);
                if ids.is_empty() {
                    self.by_ip.remove(&old_ip);
                }
            }
            self.by_ip.entry(client.ip()).or_default().insert(id.into());
        }
        self.requests.insert(session, (id.to_string(), created));
        self.refresh(id, now, now_ms);
    }

    /// An identified request session ended (a session never identified is not in the table).
    pub fn request_closed(&mut self, session: u64, now: Instant, now_ms: u64) {
        self.sweep(now);
        let Some((id, created)) = self.requests.remove(&session) else {
            return;
        };
        let Some(m) = self.minions.get_mut(&id) else {
            return;
        };
        if m.created != created {
            return;
        }
        m.request_sessions = m.request_sessions.saturating_sub(1);
        m.last_seen_ms = now_ms;
        self.refresh(&id, now, now_ms);
    }

    /// A publish session from `client` to `master` (`None`: fan-out) opened.
    pub fn publish_opened(
        &mut self,
        session: u64,
        client: SocketAddr,
        master: Option<Arc<str>>,
        now: Instant,
        now_ms: u64,
    ) {
        self.sweep(now);
        let list = self.publish.entry(client.ip()).or_default();
        list.push(PubSession { session, master });
        if list.len() == 1 {
            self.refresh_ip(client.ip(), now, now_ms);
        }
    }

    /// A publish session ended.
    pub fn publish_closed(&mut self, session: u64, client: SocketAddr, now: Instant, now_ms: u64) {
        self.sweep(now);
        let ip = client.ip();
        let Some(list) = self.publish.get_mut(&ip) else {
            return;
        };
        // One session per id, and the list's order means nothing (`publish_of` reads it as a
        // set): `swap_remove` stops at the session and moves one element, where `retain` walked
        // and shifted the whole list (thousands of sessions behind one NAT address, or a bench
        // client, closed at once when a master goes DOWN: 3.5 % of the storm's CPU).
        if let Some(i) = list.iter().position(|p| p.session == session) {
            list.swap_remove(i);
        }
        if list.is_empty() {
            self.publish.remove(&ip);
            self.refresh_ip(ip, now, now_ms);
        }
    }

    fn refresh_ip(&mut self, ip: IpAddr, now: Instant, now_ms: u64) {
        let ids: Vec<String> = self
            .by_ip
            .get(&ip)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            self.refresh(&id, now, now_ms);
        }
    }

    /// The one minion id known at `ip`, if exactly one is (several minions behind one NAT
    /// address cannot be told apart).
    pub fn sole_id_at(&self, ip: IpAddr) -> Option<&str> {
        let ids = self.by_ip.get(&ip)?;
        match (ids.len(), ids.first()) {
            (1, Some(id)) => Some(id.as_str()),
            _ => None,
        }
    }

    /// The publish side of a client address.
    pub fn publish_of(&self, ip: IpAddr) -> PublishOf {
        let Some(list) = self.publish.get(&ip).filter(|l| !l.is_empty()) else {
            return PublishOf::None;
        };
        let masters: BTreeSet<Option<&str>> = list.iter().map(|p| p.master.as_deref()).collect();
        match (masters.len(), masters.first()) {
            (1, Some(Some(m))) => PublishOf::Master(m.to_string()),
            (1, Some(None)) => PublishOf::Fanout,
            _ => PublishOf::Ambiguous(
                masters
                    .into_iter()
                    .map(|m| m.unwrap_or("fanout").to_string())
                    .collect(),
            ),
        }
    }

    /// Up to `limit` minions with an id after `after`, by id, and whether more follow.
    pub fn page(
        &mut self,
        after: Option<&str>,
        limit: usize,
        now: Instant,
    ) -> (Vec<(String, Minion, PublishOf)>, bool) {
        self.sweep(now);
        let lower = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut out: Vec<(String, Minion, PublishOf)> = self
            .minions
            .range::<str, _>((lower, Bound::Unbounded))
            .take(limit.saturating_add(1))
            .map(|(id, m)| (id.clone(), m.clone(), self.publish_of(m.client.ip())))
            .collect();
        let more = out.len() > limit;
        out.truncate(limit);
        (out, more)
    }

    /// One minion.
    pub fn get(&self, id: &str) -> Option<&Minion> {
        self.minions.get(id)
    }

    /// Totals and connected minions per master.
    pub fn counts(&mut self, now: Instant) -> Counts {
        self.sweep(now);
        let mut c = Counts {
            known: self.minions.len(),
            ..Counts::default()
        };
        let mut by_ip: HashMap<IpAddr, PublishOf> = HashMap::new();
        for m in self.minions.values().filter(|m| m.gone_since.is_none()) {
            c.connected += 1;
            c.per_master.entry(m.request_master.clone()).or_default()[1] += 1;
            let ip = m.client.ip();
            let p = by_ip.entry(ip).or_insert_with(|| self.publish_of(ip));
            match p {
                PublishOf::Master(name) => c.per_master.entry(name.clone()).or_default()[0] += 1,
                PublishOf::Ambiguous(_) => c.publish_ambiguous += 1,
                PublishOf::None | PublishOf::Fanout => {}
            }
        }
        c
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
