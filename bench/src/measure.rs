//! A measurement window: CPU ticks spent by the proxy, the load generator (this process), the
//! fake masters (the backend child) and everyone else on the machine, between two instants.

use std::time::Instant;

use crate::procfs::{self, ProcSample, SysSample};
use crate::BenchError;

/// The processes a window watches.
#[derive(Debug, Clone, Copy)]
pub struct Pids {
    pub proxy: Option<u32>,
    pub backend: u32,
}

pub struct Window {
    pids: Pids,
    start: Instant,
    proxy: Option<ProcSample>,
    me: ProcSample,
    backend: ProcSample,
    sys: SysSample,
}

/// What a window cost.
#[derive(Debug, Clone, Copy)]
pub struct Spent {
    pub secs: f64,
    pub proxy_ticks: Option<u64>,
    pub loadgen_ticks: u64,
    pub backend_ticks: u64,
    /// Busy ticks of the whole machine (all CPUs) not spent by the three above.
    pub foreign_ticks: u64,
    /// All ticks of the machine over the window (CPUs × time).
    pub machine_ticks: u64,
}

impl Window {
    pub fn start(pids: Pids) -> Result<Window, BenchError> {
        Ok(Window {
            pids,
            proxy: pids.proxy.map(procfs::sample).transpose()?,
            me: procfs::sample(0)?,
            backend: procfs::sample(pids.backend)?,
            sys: procfs::sys_sample()?,
            start: Instant::now(),
        })
    }

    pub fn end(self) -> Result<Spent, BenchError> {
        let secs = self.start.elapsed().as_secs_f64();
        let proxy = self.pids.proxy.map(procfs::sample).transpose()?;
        let me = procfs::sample(0)?;
        let backend = procfs::sample(self.pids.backend)?;
        let sys = procfs::sys_sample()?;
        let proxy_ticks = match (self.proxy, proxy) {
            (Some(a), Some(b)) => Some(b.ticks.saturating_sub(a.ticks)),
            _ => None,
        };
        let loadgen_ticks = me.ticks.saturating_sub(self.me.ticks);
        let backend_ticks = backend.ticks.saturating_sub(self.backend.ticks);
        let busy = sys.busy().saturating_sub(self.sys.busy());
        let ours = proxy_ticks.unwrap_or(0) + loadgen_ticks + backend_ticks;
        Ok(Spent {
            secs,
            proxy_ticks,
            loadgen_ticks,
            backend_ticks,
            foreign_ticks: busy.saturating_sub(ours),
            machine_ticks: sys.total.saturating_sub(self.sys.total),
        })
    }
}

impl Spent {
    /// Proxy CPU seconds.
    pub fn proxy_secs(&self) -> Option<f64> {
        self.proxy_ticks
            .map(|t| t as f64 / procfs::clock_ticks_per_sec() as f64)
    }
    /// Load generator CPU as % of one core.
    pub fn loadgen_pct(&self) -> f64 {
        pct_of_core(self.loadgen_ticks, self.secs)
    }
    /// Other processes' CPU as % of the machine.
    pub fn foreign_pct(&self) -> f64 {
        if self.machine_ticks == 0 {
            0.0
        } else {
            100.0 * self.foreign_ticks as f64 / self.machine_ticks as f64
        }
    }
}

fn pct_of_core(ticks: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    100.0 * ticks as f64 / procfs::clock_ticks_per_sec() as f64 / secs
}
