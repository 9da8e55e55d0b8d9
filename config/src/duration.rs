//! Durations as HAProxy and saltgate's YAML write them: a number and a unit (`us`, `ms`, `s`, `m`,
//! `h`, `d`), such as `86400s`, `1m` or `500ms`.
//!
//! HAProxy reads a bare number as milliseconds; saltgate's YAML refuses a bare number, because
//! `timeout_client: 60` is too easy to misread.

use std::time::Duration;

/// How a bare number (no unit) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BareNumber {
    /// HAProxy: milliseconds.
    Millis,
    /// saltgate YAML: an error.
    Refuse,
}

/// Parses `text` into a duration, or explains what is wrong and how to write it.
pub fn parse_duration(text: &str, bare: BareNumber) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid duration {text:?}: it must start with a whole number"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: the number is too large"))?;
    let d = match unit {
        "" => match bare {
            BareNumber::Millis => Some(Duration::from_millis(n)),
            BareNumber::Refuse => {
                return Err(format!(
                    "duration {text:?} has no unit; write for example {n}s or {n}ms"
                ))
            }
        },
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        "d" => n.checked_mul(86400).map(Duration::from_secs),
        other => {
            return Err(format!(
                "invalid duration {text:?}: unknown unit {other:?}; use us, ms, s, m, h or d"
            ))
        }
    };
    match d {
        Some(d) if d <= MAX => Ok(d),
        _ => Err(format!(
            "invalid duration {text:?}: longer than the 10-year maximum"
        )),
    }
}

/// The longest duration accepted (10 years): far beyond any timeout, and far from overflowing
/// when added to a clock reading.
pub const MAX: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Formats a duration in the largest unit that represents it exactly (`86400s` → `1d`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() % 1_000_000 != 0 {
        return format!("{}us", d.as_micros());
    }
    if ms == 0 {
        return "0s".to_string();
    }
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    for (unit, size) in [("d", 86400), ("h", 3600), ("m", 60)] {
        if s % size == 0 {
            return format!("{}{unit}", s / size);
        }
    }
    format!("{s}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_read_like_haproxy() {
        let cases = [
            ("86400s", 86_400_000),
            ("1m", 60_000),
            ("10s", 10_000),
            ("500ms", 500),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            ("2000", 2000),
        ];
        for (text, ms) in cases {
            assert_eq!(
                parse_duration(text, BareNumber::Millis).unwrap(),
                Duration::from_millis(ms),
                "{text}"
            );
        }
    }

    #[test]
    fn yaml_refuses_a_bare_number_and_says_how_to_write_it() {
        let e = parse_duration("60", BareNumber::Refuse).unwrap_err();
        assert!(e.contains("60s"), "{e}");
    }

    #[test]
    fn unknown_units_and_garbage_are_errors() {
        for bad in [
            "10x",
            "s",
            "",
            "-1s",
            "1.5s",
            "99999999999999999999999s",
            "99999999999999999d",
        ] {
            assert!(parse_duration(bad, BareNumber::Millis).is_err(), "{bad}");
        }
    }

    #[test]
    fn formatting_round_trips() {
        for ms in [0u64, 1, 500, 1000, 60_000, 86_400_000, 90_000, 3_600_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(
                parse_duration(&format_duration(d), BareNumber::Refuse).unwrap(),
                d
            );
        }
        assert_eq!(format_duration(Duration::from_secs(86400)), "1d");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    }
}
