//! Salt's job ids (JIDs): `YYYYMMDDhhmmssffffff`, 20 digits. Salt's master writes local time;
//! saltgate-master writes UTC. A JID names the moment its job was published, which is what the
//! swarm's receipt latency is measured from.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The JID for a moment (microsecond precision).
pub fn jid_at(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, mo, day) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}{mo:02}{day:02}{:02}{:02}{:02}{:06}",
        s / 3600,
        (s / 60) % 60,
        s % 60,
        d.subsec_micros()
    )
}

/// The moment a JID names, or `None` when it is not a valid JID.
pub fn jid_time(jid: &str) -> Option<SystemTime> {
    if jid.len() != 20 || !jid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |r: std::ops::Range<usize>| jid.get(r)?.parse::<u32>().ok();
    let (y, mo, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, mi, s, us) = (n(8..10)?, n(10..12)?, n(12..14)?, n(14..20)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + s);
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(u64::from(us)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jid_format_and_parse_round_trip() {
        let t = UNIX_EPOCH + Duration::from_micros(1_795_837_028_835_052);
        let jid = jid_at(t);
        assert_eq!(jid.len(), 20);
        assert_eq!(jid_time(&jid), Some(t));
        assert_eq!(jid_at(UNIX_EPOCH), "19700101000000000000");
        assert_eq!(
            jid_at(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229000000000000"
        );
        for bad in [
            "",
            "req",
            "2026112203370883505",
            "2026132203370883505x",
            "20261322033708835052",
        ] {
            assert_eq!(jid_time(bad), None, "{bad}");
        }
    }
}
