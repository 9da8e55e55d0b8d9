//! Discovery: the masters of a Salt 3008 cluster, read from its `cluster_pki_dir`. Every
//! `peers/<id>.pub` is a master (see [`saltgate_config::discovery`]); the directory is listed every
//! `discovery.interval`, and when the set of files changes, the configuration in force is applied
//! again through [`Control::apply`] (the file's configuration plus the discovered masters): a new
//! peer is added (state `joining` until its checks pass), a removed one is drained and goes, and
//! every other master keeps its health and sessions.
//!
//! A directory that does not exist (yet), or cannot be read, changes nothing: logged once, picked
//! up when it appears.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use saltgate_config::discovery::Skipped;
use saltgate_config::Config;

use crate::control::state::{lock, Control};

/// How long one listing of the directory may take (a hung network filesystem).
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The file names in `dir/peers`, sorted, or why they cannot be read.
fn list_peers(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("peers"))? {
        let e = e?;
        if e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// [`list_peers`] on a thread of its own, bounded by [`LIST_TIMEOUT`] (a stuck listing costs one
/// thread, and the poller does not start another while it is stuck).
async fn list_off_runtime(
    dir: PathBuf,
    busy: &Arc<std::sync::atomic::AtomicBool>,
) -> Option<std::io::Result<Vec<String>>> {
    use std::sync::atomic::Ordering;
    if busy.swap(true, Ordering::AcqRel) {
        return None;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let b = busy.clone();
    let spawned = std::thread::Builder::new()
        .name("saltgate-discovery".into())
        .spawn(move || {
            let r = list_peers(&dir);
            b.store(false, Ordering::Release);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        busy.store(false, Ordering::Release);
        return Some(Err(e));
    }
    match tokio::time::timeout(LIST_TIMEOUT, rx).await {
        Ok(Ok(r)) => Some(r),
        Ok(Err(_)) => Some(Err(std::io::Error::other(
            "the listing thread ended without an answer",
        ))),
        Err(_) => Some(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {LIST_TIMEOUT:?}"),
        ))),
    }
}

/// Logs each file that gives no master once (until it is fixed or goes).
fn warn_skipped(skipped: &[Skipped], warned: &mut BTreeSet<String>) {
    let now: BTreeSet<String> = skipped.iter().map(|s| s.file.clone()).collect();
    for s in skipped.iter().filter(|s| !warned.contains(&s.file)) {
        tracing::warn!(file = %s.file, "discovery: {s}");
    }
    *warned = now;
}

impl Control {
    /// The configuration to build from a file configuration: plus the discovered masters. Returns
    /// it with the names of the discovered masters it adds.
    pub(crate) fn with_discovered(&self, file: &Config) -> (Config, Vec<String>) {
        let peers = lock(&self.peer_files).clone();
        let (config, added, _) = saltgate_config::discovery::merge(file, &peers);
        (config, added)
    }

    /// Lists the peers once before the first configuration is put in force.
    pub(crate) async fn discover_at_start(&self, config: &Config) {
        let Some(d) = &config.discovery else { return };
        if config.publish.mode == saltgate_config::ListenerMode::L4 {
            // The default stays L4 on purpose (docs/fanout.md, "The default"); say once what a
            // cluster gains from fan-out.
            tracing::info!(cluster_pki_dir = %d.cluster_pki_dir.display(), "the masters are one Salt 3008 cluster (discovery): listeners.publish.mode: fanout would keep every minion's publish session open when a master dies (no reconnect, no missed job), with dedup_cluster_pki_dir for one copy of each job; this saltgate keeps the publish listener in L4 as configured (docs/fanout.md)");
        }
        let busy = Arc::default();
        match list_off_runtime(d.cluster_pki_dir.clone(), &busy).await {
            Some(Ok(files)) => {
                let (_, added, skipped) = saltgate_config::discovery::merge(config, &files);
                tracing::info!(dir = %d.cluster_pki_dir.join("peers").display(), masters = ?added, "discovery: peers found at start");
                warn_skipped(&skipped, &mut lock(&self.discovery_warned));
                *lock(&self.peer_files) = files;
            }
            Some(Err(e)) => {
                *lock(&self.discovery_problem) = Some(e.kind());
                tracing::warn!(dir = %d.cluster_pki_dir.join("peers").display(), error = %e, "discovery: cannot list the cluster's peer keys yet; saltgate starts with the configured masters and picks the peers up when the directory appears");
            }
            None => {}
        }
    }
}

/// Lists `peers/` every `discovery.interval` while discovery is configured; applies the
/// configuration again when the set of peer files changes.
pub(crate) async fn watch_peers(control: Arc<Control>) {
    let busy = Arc::default();
    loop {
        let every = lock(&control.file_config)
            .as_ref()
            .and_then(|c| c.discovery.as_ref().map(|d| d.interval));
        tokio::select! {
            _ = tokio::time::sleep(every.unwrap_or(Duration::from_secs(1))) => {}
            _ = control.accept_stop.cancelled() => return,
        }
        let Some(config) = lock(&control.file_config).clone() else {
            continue;
        };
        let Some(d) = config.discovery.clone() else {
            continue;
        };
        let dir = d.cluster_pki_dir.join("peers");
        let files = match list_off_runtime(d.cluster_pki_dir.clone(), &busy).await {
            None => continue, // the previous listing is still stuck
            Some(Err(e)) => {
                let mut seen = lock(&control.discovery_problem);
                if *seen != Some(e.kind()) {
                    tracing::warn!(dir = %dir.display(), error = %e, "discovery: cannot list the cluster's peer keys; the masters found so far stay (fix the path or its permissions in discovery.cluster_pki_dir)");
                    *seen = Some(e.kind());
                }
                continue;
            }
            Some(Ok(files)) => {
                if lock(&control.discovery_problem).take().is_some() {
                    tracing::info!(dir = %dir.display(), "discovery: the peer key directory can be read");
                }
                files
            }
        };
        if *lock(&control.peer_files) == files {
            continue;
        }
        let (_, before, _) = saltgate_config::discovery::merge(&config, &lock(&control.peer_files));
        let (_, after, skipped) = saltgate_config::discovery::merge(&config, &files);
        warn_skipped(&skipped, &mut lock(&control.discovery_warned));
        let old = std::mem::replace(&mut *lock(&control.peer_files), files);
        if before == after {
            continue; // only files that give no master changed
        }
        let joined: Vec<&String> = after.iter().filter(|m| !before.contains(m)).collect();
        let left: Vec<&String> = before.iter().filter(|m| !after.contains(m)).collect();
        tracing::info!(joined = ?joined, left = ?left, "discovery: the cluster's peers changed; applying");
        let r = control.apply(config, false).await;
        control.metrics.events.reload(
            "discovery",
            r.as_ref().map(|g| *g).map_err(|e| e.to_string()),
        );
        let label = r.as_ref().map(|_| "ok").unwrap_or_else(|e| e.kind());
        control.metrics.reloads.with_label_values(&[label]).inc();
        if let Err(e) = r {
            tracing::error!(error = %e, "discovery: applying the new set of masters failed; the running configuration stays (retried at the next listing)");
            *lock(&control.peer_files) = old;
        }
    }
}
