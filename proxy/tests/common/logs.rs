//! Log lines as a real `fmt` subscriber writes them (text, no colours), captured in memory.
#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Mutex};

/// What the subscriber wrote.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A subscriber at `filter` (`RUST_LOG` syntax) writing here.
    pub fn subscriber(&self, filter: &str) -> impl tracing::Subscriber + Send + Sync {
        let w = self.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish()
    }

    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The first line containing every one of `parts`.
    pub fn find(&self, parts: &[&str]) -> Option<String> {
        self.lines()
            .into_iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
    }
}

/// The id in a line's `session{id=..` span (the proxy's per-session span), if it has one.
pub fn session_id(line: &str) -> Option<String> {
    line.split_once("session{id=")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(id, _)| id.to_string())
}
