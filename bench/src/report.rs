//! From samples to what people and machines read: medians per target over the repeats, the
//! saltgate/HAProxy ratio, the issue's goal for that ratio and whether it is met, the CPU ticks
//! each figure rests on; rendered as Markdown or JSON. Pure (the chart is in `chart`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::scenarios::Sample;
use crate::stats::median;
use crate::targets::{ProxySettings, TargetKind};

/// The run's circumstances.
#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    pub command: String,
    pub started_utc: String,
    pub finished_utc: String,
    pub quick: bool,
    pub repeat: usize,
    pub cpus: usize,
    pub clock_ticks_per_sec: u64,
    pub cpu_model: String,
    pub kernel: String,
    pub haproxy: String,
    pub saltgate: String,
    pub loadavg_before: String,
    pub loadavg_after: String,
    /// Whole machine idle over the run, % (from /proc/stat before and after).
    pub machine_idle_pct: f64,
    /// Busy ticks of the machine over the run not spent by the proxy, the load generator or
    /// the fake masters, as % of the machine (max over all windows, and the median).
    pub foreign_cpu_pct_max: f64,
    pub foreign_cpu_pct_median: f64,
    pub settings: ProxySettings,
}

/// One figure: medians per target and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: &'static str,
    pub figure: &'static str,
    pub case: String,
    pub unit: &'static str,
    pub direct: Option<f64>,
    pub haproxy: Option<f64>,
    pub saltgate: Option<f64>,
    /// saltgate / HAProxy of the medians.
    pub ratio: Option<f64>,
    /// The issue's bound on the ratio (met when ratio ≤ goal).
    pub goal: Option<f64>,
    pub met: Option<bool>,
    /// Median proxy CPU ticks per run the figure rests on.
    pub haproxy_ticks: Option<f64>,
    pub saltgate_ticks: Option<f64>,
    /// Highest load generator CPU (% of one core) over the runs of this figure.
    pub loadgen_cpu_pct_max: f64,
    /// Runs per target.
    pub runs: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub meta: Meta,
    pub rows: Vec<Row>,
    pub samples: Vec<Sample>,
}

/// The issue's targets: saltgate/HAProxy at most this.
pub fn goal(scenario: &str, figure: &str, case: &str) -> Option<f64> {
    match (scenario, figure) {
        ("idle", "RSS per idle session") => Some(0.3),
        ("throughput", "CPU per GB") => Some(0.5),
        ("rr", "CPU per request") if case == "100 conns" || case == "1000 conns" => Some(0.8),
        ("connect", "CPU per session") => Some(0.8),
        ("storm", "first loss to all re-established") => Some(1.0),
        _ => None,
    }
}

/// Figures in the order the table shows them (within a scenario); others after these.
const FIGURE_ORDER: [&str; 13] = [
    "RSS per idle session",
    "RSS kept after the first open/close cycle",
    "RSS growth over 4 more open/close cycles",
    "CPU per session",
    "sessions per second",
    "CPU per request",
    "latency p50",
    "latency p99",
    "requests per second",
    "CPU per GB",
    "throughput",
    "first loss to all re-established",
    "stop to all re-established",
];

/// (scenario, figure, case, unit): what a row is about.
type Key = (&'static str, &'static str, String, &'static str);

/// Rates, where more is better: the chart (lower is better) leaves them out.
pub fn higher_is_better(figure: &str) -> bool {
    matches!(
        figure,
        "sessions per second" | "requests per second" | "throughput"
    )
}

/// Groups samples by (scenario, figure, case): scenarios and cases in the order first seen,
/// figures in [`FIGURE_ORDER`].
pub fn rows(samples: &[Sample]) -> Vec<Row> {
    let mut keys: Vec<Key> = Vec::new();
    for s in samples {
        let k = (s.scenario, s.figure, s.case.clone(), s.unit);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let first_seen = |pick: &dyn Fn(&Key) -> String| {
        let mut seen: Vec<String> = Vec::new();
        for k in &keys {
            let v = pick(k);
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        seen
    };
    let scenarios = first_seen(&|k| k.0.to_string());
    let cases = first_seen(&|k| format!("{}/{}", k.0, k.2));
    let pos = |v: &[String], x: String| v.iter().position(|y| *y == x).unwrap_or(usize::MAX);
    keys.sort_by_key(|k| {
        (
            pos(&scenarios, k.0.to_string()),
            FIGURE_ORDER
                .iter()
                .position(|f| *f == k.1)
                .unwrap_or(usize::MAX),
            pos(&cases, format!("{}/{}", k.0, k.2)),
        )
    });
    keys.into_iter()
        .map(|(scenario, figure, case, unit)| {
            let of = |t: TargetKind| -> Vec<&Sample> {
                samples
                    .iter()
                    .filter(|s| {
                        s.scenario == scenario
                            && s.figure == figure
                            && s.case == case
                            && s.target == t
                    })
                    .collect()
            };
            let med = |t: TargetKind| median(&of(t).iter().map(|s| s.value).collect::<Vec<_>>());
            let ticks = |t: TargetKind| {
                median(
                    &of(t)
                        .iter()
                        .filter_map(|s| s.proxy_ticks.map(|x| x as f64))
                        .collect::<Vec<_>>(),
                )
            };
            let (haproxy, saltgate) = (med(TargetKind::Haproxy), med(TargetKind::Saltgate));
            let ratio = match (haproxy, saltgate) {
                (Some(h), Some(s)) if h != 0.0 => Some(s / h),
                _ => None,
            };
            let goal = goal(scenario, figure, &case);
            let all: Vec<&Sample> = TargetKind::ALL.iter().flat_map(|t| of(*t)).collect();
            Row {
                scenario,
                figure,
                unit,
                direct: med(TargetKind::Direct),
                haproxy,
                saltgate,
                ratio,
                goal,
                met: goal.zip(ratio).map(|(g, r)| r <= g),
                haproxy_ticks: ticks(TargetKind::Haproxy),
                saltgate_ticks: ticks(TargetKind::Saltgate),
                loadgen_cpu_pct_max: all.iter().map(|s| s.loadgen_cpu_pct).fold(0.0, f64::max),
                runs: TargetKind::ALL
                    .iter()
                    .map(|t| of(*t).len())
                    .max()
                    .unwrap_or(0),
                case,
            }
        })
        .collect()
}

/// Three significant digits, no exponent for ordinary sizes.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "—".into())
}

/// The Markdown report: the table, then the circumstances.
pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| scenario | figure | case | unit | direct | HAProxy | saltgate | saltgate/HAProxy | goal | met | proxy ticks HA / sg | load gen CPU max |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|"
    );
    for row in &r.rows {
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        let t = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "—".into());
        let ticks = match (row.haproxy_ticks, row.saltgate_ticks) {
            (None, None) => "—".to_string(),
            (h, g) => format!("{} / {}", t(h), t(g)),
        };
        let lg = if row.loadgen_cpu_pct_max > 0.0 {
            format!("{:.0} %", row.loadgen_cpu_pct_max)
        } else {
            "—".into()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.scenario,
            row.figure,
            row.case,
            row.unit,
            opt(row.direct),
            opt(row.haproxy),
            opt(row.saltgate),
            row.ratio
                .map(|x| format!("{x:.2}×"))
                .unwrap_or_else(|| "—".into()),
            row.goal.map(|g| format!("≤ {g}×")).unwrap_or_default(),
            met,
            ticks,
            lg,
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "Medians of {} run(s) per target, targets interleaved (order rotated each repeat). Proxy ticks: \
         median utime+stime ticks (1 tick = {} ms) of the proxy process per run behind a CPU figure. \
         Load gen CPU: the bench process (all threads), % of one core.",
        m.repeat,
        1000 / m.clock_ticks_per_sec.max(1)
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "- command: `{}`", m.command);
    let _ = writeln!(s, "- run: {} → {} (UTC)", m.started_utc, m.finished_utc);
    let _ = writeln!(
        s,
        "- machine: {} CPU(s), {}, kernel {}",
        m.cpus, m.cpu_model, m.kernel
    );
    let _ = writeln!(s, "- HAProxy: {}; saltgate: {}", m.haproxy, m.saltgate);
    let _ = writeln!(
        s,
        "- background: loadavg before `{}`, after `{}`; machine idle over the run {:.0} %; \
         other processes' CPU during the measured windows: median {:.0} %, max {:.0} % of the machine",
        m.loadavg_before, m.loadavg_after, m.machine_idle_pct, m.foreign_cpu_pct_median, m.foreign_cpu_pct_max
    );
    let st = &m.settings;
    let _ = writeln!(
        s,
        "- proxy settings (both): TCP checks every {} ms (timeout {} ms, rise {}, fall {}), round-robin over 2 masters, \
         maxconn {}, backlog {}, idle timeouts 86400 s, DOWN master's sessions closed at once, no access log",
        st.check_interval_ms, st.check_timeout_ms, st.rise, st.fall, st.maxconn, st.backlog
    );
    s
}

/// `YYYY-MM-DD HH:MM:SS` for seconds since the Unix epoch (UTC).
pub fn utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(target: TargetKind, value: f64, ticks: Option<u64>) -> Sample {
        let mut s = Sample::new(
            "rr",
            "CPU per request",
            "100 conns",
            "µs",
            target,
            value,
            None,
        );
        s.proxy_ticks = ticks;
        s
    }

    #[test]
    fn rows_take_medians_per_target_and_judge_the_ratio_against_the_goal() {
        let samples = vec![
            sample(TargetKind::Haproxy, 20.0, Some(100)),
            sample(TargetKind::Haproxy, 10.0, Some(90)),
            sample(TargetKind::Haproxy, 30.0, Some(110)),
            sample(TargetKind::Saltgate, 15.0, Some(80)),
            sample(TargetKind::Saltgate, 17.0, Some(70)),
            sample(TargetKind::Saltgate, 16.0, Some(75)),
        ];
        let r = rows(&samples);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].haproxy, Some(20.0));
        assert_eq!(r[0].saltgate, Some(16.0));
        assert_eq!(r[0].ratio, Some(0.8));
        assert_eq!(r[0].met, Some(true));
        assert_eq!(r[0].saltgate_ticks, Some(75.0));
        assert_eq!(r[0].direct, None);
        assert_eq!(r[0].runs, 3);
    }

    #[test]
    fn a_ratio_above_the_goal_is_not_met_and_figures_without_goal_have_no_verdict() {
        let mut samples = vec![
            sample(TargetKind::Haproxy, 10.0, None),
            sample(TargetKind::Saltgate, 9.0, None),
        ];
        assert_eq!(rows(&samples)[0].met, Some(false));
        for s in &mut samples {
            s.case = "1 conn".into();
        }
        assert_eq!(rows(&samples)[0].met, None);
    }

    #[test]
    fn goals_are_the_issues() {
        assert_eq!(goal("idle", "RSS per idle session", "8k"), Some(0.3));
        assert_eq!(
            goal("throughput", "CPU per GB", "client → master"),
            Some(0.5)
        );
        assert_eq!(goal("rr", "CPU per request", "1 conn"), None);
        assert_eq!(goal("rr", "CPU per request", "1000 conns"), Some(0.8));
        assert_eq!(goal("connect", "CPU per session", "sequential"), Some(0.8));
        assert_eq!(
            goal("storm", "first loss to all re-established", "4k clients"),
            Some(1.0)
        );
    }

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_361_535), "2026-11-22 15:32:15");
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!(num(2.8234), "2.82");
        assert_eq!(num(16.34), "16.3");
        assert_eq!(num(212.4), "212");
        assert_eq!(num(0.8312), "0.831");
    }
}
