//! The `authstorm` report: one row per figure and size, a column per way, the ratio
//! `auth_limit` ÷ L4, and issue 25's targets for the limited way.

use std::fmt::Write as _;

use serde::Serialize;

use super::authstorm::Way;
use super::count_label;
use crate::report::num;

/// The rotation storm of one way.
#[derive(Debug, Clone, Serialize)]
pub struct Rotation {
    /// `salt-key -d` → the master took the dropfile (rotated its AES key).
    pub secs_to_rotate: f64,
    /// The publish after the rotation → the last `True` return (None: not all returned).
    pub secs_to_all_pinged: Option<f64>,
    pub returns: usize,
    /// Over the rotation (from `salt-key -d` to the last return).
    pub auth_processed: u64,
    pub master_cpu_secs: f64,
    pub downs: Option<u64>,
    /// saltgate's DOWN flips during the rotation, by reason (as [`WayRun::down_reasons`]).
    pub down_reasons: Vec<(String, u64)>,
    /// Publish sessions saltgate accepted during the rotation (minions reconnecting).
    pub publish_sessions: Option<u64>,
    /// Publish checks not counted during the rotation (busy, not hung).
    pub publish_busy_checks: Option<u64>,
}

/// One way at one size.
#[derive(Debug, Clone, Serialize)]
pub struct WayRun {
    pub way: Way,
    pub minions: usize,
    /// Minions authenticated at the end (all, or at the cap).
    pub authenticated: usize,
    pub secs_to_all: Option<f64>,
    pub master_cpu_secs: f64,
    pub auth_processed: u64,
    /// saltgate's `saltgate_master_state_changes_total{to="down"}` (None: no saltgate).
    pub downs: Option<u64>,
    /// saltgate's `_auth` admitted to the master and dropped (the limited way).
    pub gate_admitted: Option<f64>,
    pub gate_dropped: Option<f64>,
    /// Admitted `_auth` whose minion left before the master answered (the master's wasted work
    /// the gate let through).
    pub gate_orphaned: Option<f64>,
    /// saltgate's DOWN flips over the storm by reason (the check's detail, its digits cut),
    /// most frequent first: why a busy master was taken for a dead one.
    pub down_reasons: Vec<(String, u64)>,
    pub swarm_auth_timeouts: i64,
    pub swarm_auth_retries: i64,
    pub rotation: Option<Rotation>,
    /// Other processes' CPU over the authentication window, % of the machine.
    pub foreign_cpu_pct: f64,
    pub loadavg: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub figure: &'static str,
    pub case: String,
    pub unit: &'static str,
    /// In the order of [`Way::ALL`]; None: not run, or no value (e.g. not all authenticated).
    pub values: [Option<f64>; 4],
    /// `auth_limit` ÷ L4.
    pub ratio: Option<f64>,
    pub target: Option<&'static str>,
    pub met: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuthstormReport {
    pub command: String,
    pub started_utc: String,
    pub finished_utc: String,
    pub cpus: usize,
    pub loadavg_before: String,
    pub loadavg_after: String,
    pub machine_idle_pct: f64,
    pub start_rate: u32,
    pub cap_secs: u64,
    pub max_in_flight: String,
    /// 1: one salt-master; more: a cluster of that many members.
    pub masters: usize,
    pub rows: Vec<Row>,
    pub runs: Vec<WayRun>,
    pub failures: Vec<String>,
}

type Pick = fn(&WayRun) -> Option<f64>;

fn per_auth(r: &WayRun, v: f64) -> Option<f64> {
    (r.authenticated > 0).then(|| v / r.authenticated as f64)
}

/// (figure, unit, value, target for the limited way).
const FIGURES: [(&str, &str, Pick, Option<&str>); 9] = [
    (
        "minions authenticated",
        "count",
        |r| Some(r.authenticated as f64),
        None,
    ),
    (
        "time until all authenticated",
        "s",
        |r| r.secs_to_all,
        Some("≤ 0.75× L4"),
    ),
    (
        "master CPU per authenticated minion",
        "ms",
        |r| per_auth(r, r.master_cpu_secs * 1e3),
        Some("≤ 0.6× L4"),
    ),
    (
        "`_auth` processed per authenticated minion",
        "count",
        |r| per_auth(r, r.auth_processed as f64),
        Some("≤ 1.5"),
    ),
    (
        "master marked DOWN (saltgate)",
        "times",
        |r| r.downs.map(|d| d as f64),
        Some("0"),
    ),
    (
        "swarm `_auth` timeouts",
        "count",
        |r| Some(r.swarm_auth_timeouts as f64),
        None,
    ),
    (
        "rotation: time until every test.ping return",
        "s",
        |r| r.rotation.as_ref().and_then(|x| x.secs_to_all_pinged),
        None,
    ),
    (
        "rotation: `_auth` processed per minion",
        "count",
        |r| {
            r.rotation
                .as_ref()
                .map(|x| x.auth_processed as f64 / r.minions.max(1) as f64)
        },
        None,
    ),
    (
        "rotation: master CPU per minion",
        "ms",
        |r| {
            r.rotation
                .as_ref()
                .map(|x| x.master_cpu_secs * 1e3 / r.minions.max(1) as f64)
        },
        None,
    ),
];

/// The table's rows. `cap_secs`: the wait for every minion; an L4 run capped there took at
/// least that long, so a limited run within 0.75× of the cap meets the time target.
pub fn rows(runs: &[WayRun], sizes: &[usize], cap_secs: f64) -> Vec<Row> {
    let mut out = Vec::new();
    for &n in sizes {
        for (figure, unit, pick, target) in FIGURES {
            let mut values = [None; 4];
            for (i, w) in Way::ALL.iter().enumerate() {
                values[i] = runs
                    .iter()
                    .find(|r| r.way == *w && r.minions == n)
                    .and_then(pick);
            }
            let (l4, lim) = (values[2], values[3]);
            let ratio = match (l4, lim) {
                (Some(a), Some(b)) if a > 0.0 => Some(b / a),
                _ => None,
            };
            let limited = runs
                .iter()
                .find(|r| r.way == Way::SaltgateLimit && r.minions == n);
            let met = match (figure, limited) {
                (_, None) => None,
                ("time until all authenticated", Some(r)) => {
                    let l4_capped = runs.iter().any(|w| {
                        w.way == Way::SaltgateL4 && w.minions == n && w.secs_to_all.is_none()
                    });
                    let within_cap = lim.is_some_and(|x| x <= 0.75 * cap_secs);
                    Some(
                        r.authenticated >= n
                            && (ratio.is_some_and(|x| x <= 0.75) || (l4_capped && within_cap)),
                    )
                }
                ("master CPU per authenticated minion", _) => ratio.map(|x| x <= 0.6),
                ("`_auth` processed per authenticated minion", _) => lim.map(|x| x <= 1.5),
                ("master marked DOWN (saltgate)", _) => lim.map(|x| x == 0.0),
                _ => None,
            };
            out.push(Row {
                figure,
                case: format!("{} minions", count_label(n)),
                unit,
                values,
                ratio,
                target,
                met,
            });
        }
    }
    out
}

pub fn markdown(r: &AuthstormReport) -> String {
    let mut s = String::from(
        "| figure | case | unit | direct | HAProxy | saltgate L4 | saltgate auth_limit | limit ÷ L4 | target (limit) | met |\n|---|---|---|---:|---:|---:|---:|---:|---|---|\n",
    );
    let o = |v: Option<f64>| v.map(num).unwrap_or_else(|| "—".into());
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.figure,
            row.case,
            row.unit,
            o(row.values[0]),
            o(row.values[1]),
            o(row.values[2]),
            o(row.values[3]),
            row.ratio
                .map(|x| format!("{}×", num(x)))
                .unwrap_or_else(|| "—".into()),
            row.target.unwrap_or(""),
            match row.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "",
            },
        );
    }
    let _ = write!(
        s,
        "\n- command: `{}`\n- masters: {}\n- run: {} → {} (UTC), {} CPU(s); swarm started at {}/s; cap {} s; auth_limit max_in_flight: {}\n- background: loadavg before `{}`, after `{}`; machine idle over the run {:.0} %\n",
        r.command,
        if r.masters <= 1 {
            "one salt-master 3008.5".to_string()
        } else {
            format!("a {}-member salt-master 3008.5 cluster (direct: the minions spread evenly over the members)", r.masters)
        },
        r.started_utc,
        r.finished_utc,
        r.cpus,
        r.start_rate,
        r.cap_secs,
        r.max_in_flight,
        r.loadavg_before,
        r.loadavg_after,
        r.machine_idle_pct,
    );
    for w in &r.runs {
        let _ = writeln!(
            s,
            "- {} {}: other processes' CPU {:.0} % of the machine, loadavg `{}`; swarm `_auth` retries {}; saltgate `_auth` admitted {} dropped {} orphaned {}{}{}",
            w.way.label(),
            count_label(w.minions),
            w.foreign_cpu_pct,
            w.loadavg,
            w.swarm_auth_retries,
            o(w.gate_admitted),
            o(w.gate_dropped),
            o(w.gate_orphaned),
            reasons(&w.down_reasons),
            w.rotation.as_ref().map_or(String::new(), |x| format!(
                "; rotation: key rotated {:.1} s after salt-key -d, {} returns, publish sessions accepted {}, publish checks not counted (busy) {}, DOWN {}{}",
                x.secs_to_rotate,
                x.returns,
                o(x.publish_sessions.map(|v| v as f64)),
                o(x.publish_busy_checks.map(|v| v as f64)),
                x.downs.map_or("—".into(), |d| d.to_string()),
                reasons(&x.down_reasons)
            )),
        );
    }
    for f in &r.failures {
        let _ = writeln!(s, "- **did not complete:** {f}");
    }
    s
}

/// The DOWN flips of an `/api/v1/events` answer, counted by reason with its digits cut (the
/// seconds and counts in a reason differ from one flip to the next), most frequent first.
/// "; DOWN flips by reason: ..." (empty: none).
fn reasons(r: &[(String, u64)]) -> String {
    if r.is_empty() {
        return String::new();
    }
    let r: Vec<String> = r.iter().map(|(why, n)| format!("{n}x `{why}`")).collect();
    format!("; DOWN flips by reason: {}", r.join(", "))
}

/// The flips counted in `after` beyond those in `before` (two readings of [`down_reasons`]).
pub fn reasons_since(before: &[(String, u64)], after: Vec<(String, u64)>) -> Vec<(String, u64)> {
    after
        .into_iter()
        .filter_map(|(why, n)| {
            let was = before
                .iter()
                .find(|(w, _)| *w == why)
                .map_or(0, |(_, n)| *n);
            (n > was).then(|| (why, n - was))
        })
        .collect()
}

pub fn down_reasons(events_json: &str) -> Vec<(String, u64)> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(events_json) else {
        return Vec::new();
    };
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    for e in v["events"].as_array().into_iter().flatten() {
        if e["kind"] == "flip" && e["to"] == "down" {
            let reason = e["reason"].as_str().unwrap_or("?");
            let cut: String = reason
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            let key = format!("{} port: {cut}", e["port"].as_str().unwrap_or("?"));
            *counts.entry(key).or_default() += 1;
        }
    }
    let mut v: Vec<(String, u64)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(way: Way, auth: usize, secs: Option<f64>, cpu: f64, processed: u64) -> WayRun {
        WayRun {
            way,
            minions: 100,
            authenticated: auth,
            secs_to_all: secs,
            master_cpu_secs: cpu,
            auth_processed: processed,
            downs: matches!(way, Way::SaltgateL4 | Way::SaltgateLimit).then_some(0),
            gate_admitted: None,
            gate_dropped: None,
            gate_orphaned: None,
            down_reasons: Vec::new(),
            swarm_auth_timeouts: 0,
            swarm_auth_retries: 0,
            rotation: None,
            foreign_cpu_pct: 0.0,
            loadavg: String::new(),
        }
    }

    #[test]
    fn the_rotations_reasons_are_the_flips_after_it_began() {
        let r = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(w, n)| (w.to_string(), *n)).collect()
        };
        let before = r(&[("publish port: late", 2), ("request port: busy", 1)]);
        let after = r(&[
            ("publish port: late", 5),
            ("request port: busy", 1),
            ("publish port: refused", 1),
        ]);
        assert_eq!(
            reasons_since(&before, after),
            r(&[("publish port: late", 3), ("publish port: refused", 1)])
        );
    }

    #[test]
    fn rows_compare_the_limit_with_l4_and_judge_issue_25s_targets() {
        let runs = vec![
            run(Way::Direct, 40, None, 20.0, 4000),
            run(Way::SaltgateL4, 100, Some(80.0), 2.0, 500),
            run(Way::SaltgateLimit, 100, Some(40.0), 1.0, 110),
        ];
        let rows = rows(&runs, &[100], 300.0);
        let get = |f: &str| rows.iter().find(|r| r.figure == f).unwrap();
        let t = get("time until all authenticated");
        assert_eq!(t.values, [None, None, Some(80.0), Some(40.0)]);
        assert_eq!((t.ratio, t.met), (Some(0.5), Some(true)));
        let c = get("master CPU per authenticated minion");
        // 20 s over the 40 that made it: 500 ms each.
        assert_eq!(c.values[0], Some(500.0));
        assert_eq!(c.met, Some(true));
        let a = get("`_auth` processed per authenticated minion");
        assert_eq!(a.values[3], Some(1.1));
        assert_eq!(a.met, Some(true));
        assert_eq!(get("master marked DOWN (saltgate)").met, Some(true));
        let md = markdown(&AuthstormReport {
            command: "x".into(),
            started_utc: String::new(),
            finished_utc: String::new(),
            cpus: 2,
            loadavg_before: String::new(),
            loadavg_after: String::new(),
            machine_idle_pct: 0.0,
            start_rate: 1000,
            cap_secs: 300,
            max_in_flight: "auto".into(),
            masters: 3,
            rows,
            runs,
            failures: vec!["HAProxy, 100 minions: x".into()],
        });
        assert!(md.contains("| 0.500× | ≤ 0.75× L4 | yes |"), "{md}");
        assert!(
            md.contains("- masters: a 3-member salt-master 3008.5 cluster"),
            "{md}"
        );
        assert!(md.contains("**did not complete:** HAProxy"));
    }

    #[test]
    fn a_limited_run_that_did_not_finish_misses_the_time_target() {
        let runs = vec![
            run(Way::SaltgateL4, 100, Some(80.0), 2.0, 500),
            run(Way::SaltgateLimit, 90, None, 1.0, 110),
        ];
        let rows = rows(&runs, &[100], 300.0);
        let t = rows
            .iter()
            .find(|r| r.figure == "time until all authenticated")
            .unwrap();
        assert_eq!(t.met, Some(false));
    }

    #[test]
    fn l4_capped_and_the_limit_well_within_the_cap_meets_the_time_target() {
        let runs = vec![
            run(Way::SaltgateL4, 100, None, 2.0, 500),
            run(Way::SaltgateLimit, 100, Some(142.0), 1.0, 110),
        ];
        let time = |cap: f64| {
            rows(&runs, &[100], cap)
                .into_iter()
                .find(|r| r.figure == "time until all authenticated")
                .unwrap()
                .met
        };
        assert_eq!(
            time(300.0),
            Some(true),
            "142 s <= 0.75 x the 300 s L4 did not finish in"
        );
        assert_eq!(time(150.0), Some(false), "142 s > 0.75 x 150 s: not shown");
    }

    #[test]
    fn down_flips_are_counted_by_reason_without_their_numbers() {
        let j = r#"{"events":[
            {"seq":3,"at_ms":3,"kind":"flip","master":"m1","port":"request","from":"up","to":"down","reason":"salt ping: no answer within 5s"},
            {"seq":2,"at_ms":2,"kind":"flip","master":"m2","port":"request","from":"up","to":"down","reason":"salt ping: no answer within 6s"},
            {"seq":1,"at_ms":1,"kind":"flip","master":"m1","port":"request","from":"down","to":"up","reason":"ok"},
            {"seq":0,"at_ms":0,"kind":"reload","generation":1,"trigger":"start","ok":true,"error":null}]}"#;
        assert_eq!(
            down_reasons(j),
            vec![(
                "request port: salt ping: no answer within #s".to_string(),
                2
            )]
        );
        assert!(down_reasons("not json").is_empty());
    }
}
