//! A subscriber's topics on a PUB side: a multiset of prefixes, as libzmq keeps it per
//! subscriber, with limits on how many distinct topics and how many bytes of them one peer may
//! hold (a SUBSCRIBE is unauthenticated: without limits, a peer makes the publisher keep any
//! amount of memory, and a set scanned per SUBSCRIBE costs CPU quadratic in its size).
//!
//! SUBSCRIBE and CANCEL are O(1) (a hash map); matching a message scans the distinct topics, at
//! most [`TopicLimits::max_topics`]. A Salt minion subscribes to one topic (`""`), or with
//! `zmq_filtering` to `broadcast` and its hashed id: the defaults leave ample room.

use std::collections::HashMap;

use bytes::Bytes;
use thiserror::Error;

/// Distinct topics one subscriber may hold by default.
pub const DEFAULT_MAX_TOPICS: usize = 64;
/// Bytes of distinct topics one subscriber may hold by default (a Salt topic is at most a
/// hashed id: 64 hex characters).
pub const DEFAULT_MAX_TOPIC_BYTES: usize = 8 * 1024;

/// What one subscriber may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLimits {
    /// Distinct topics.
    pub max_topics: usize,
    /// Sum of the lengths of the distinct topics.
    pub max_bytes: usize,
}

impl Default for TopicLimits {
    fn default() -> Self {
        TopicLimits {
            max_topics: DEFAULT_MAX_TOPICS,
            max_bytes: DEFAULT_MAX_TOPIC_BYTES,
        }
    }
}

/// A SUBSCRIBE refused for a limit: the peer is cut.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum TopicRefusal {
    #[error("more than {max} distinct topics subscribed (raise max_topics)")]
    TooMany { max: usize },
    #[error("topics of more than {max} bytes subscribed (raise max_topic_bytes)")]
    TooManyBytes { max: usize },
}

impl TopicRefusal {
    /// A metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            TopicRefusal::TooMany { .. } => "topics",
            TopicRefusal::TooManyBytes { .. } => "topic_bytes",
        }
    }
}

/// A subscription multiset with prefix matching and limits.
#[derive(Debug, Default)]
pub struct TopicSet {
    topics: HashMap<Bytes, usize>,
    bytes: usize,
    limits: TopicLimits,
}

impl TopicSet {
    pub fn new(limits: TopicLimits) -> Self {
        TopicSet {
            topics: HashMap::new(),
            bytes: 0,
            limits,
        }
    }

    /// Adds one subscription to `topic`; a topic already held only counts once more (no
    /// bytes). Refused, leaving the set as it was, when a new topic would pass a limit.
    pub fn subscribe(&mut self, topic: Bytes) -> Result<(), TopicRefusal> {
        if let Some(n) = self.topics.get_mut(&topic) {
            *n = n.saturating_add(1);
            return Ok(());
        }
        if self.topics.len() >= self.limits.max_topics {
            return Err(TopicRefusal::TooMany {
                max: self.limits.max_topics,
            });
        }
        let bytes = self.bytes.saturating_add(topic.len());
        if bytes > self.limits.max_bytes {
            return Err(TopicRefusal::TooManyBytes {
                max: self.limits.max_bytes,
            });
        }
        self.bytes = bytes;
        self.topics.insert(topic, 1);
        Ok(())
    }

    /// Removes one subscription to `topic` (the topic goes when its count reaches 0); a topic
    /// never subscribed is ignored, as libzmq does.
    pub fn cancel(&mut self, topic: &[u8]) {
        let gone = match self.topics.get_mut(topic) {
            Some(n) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if gone {
            self.topics.remove(topic);
            self.bytes = self.bytes.saturating_sub(topic.len());
        }
    }

    /// Whether a message whose first frame is `first_frame` goes to this subscriber.
    pub fn matches(&self, first_frame: &[u8]) -> bool {
        self.topics.keys().any(|t| first_frame.starts_with(t))
    }

    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// Distinct topics held.
    pub fn len(&self) -> usize {
        self.topics.len()
    }

    /// Bytes of the distinct topics held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_set_matches_by_prefix_and_counts_duplicates() {
        let mut t = TopicSet::default();
        assert!(!t.matches(b"anything"));
        t.subscribe(Bytes::from_static(b"broad")).unwrap();
        t.subscribe(Bytes::from_static(b"broad")).unwrap();
        assert!(t.matches(b"broadcast"));
        assert!(!t.matches(b"bro"));
        t.cancel(b"broad");
        assert!(t.matches(b"broadcast"));
        t.cancel(b"broad");
        assert!(!t.matches(b"broadcast"));
        assert_eq!((t.len(), t.bytes()), (0, 0));
        t.cancel(b"never");
        t.subscribe(Bytes::new()).unwrap();
        assert!(t.matches(b""));
        assert!(t.matches(b"x"));
    }

    #[test]
    fn topics_past_either_limit_are_refused_and_change_nothing() {
        let mut t = TopicSet::new(TopicLimits {
            max_topics: 2,
            max_bytes: 10,
        });
        t.subscribe(Bytes::from_static(b"aaaa")).unwrap();
        assert_eq!(
            t.subscribe(Bytes::from_static(b"bbbbbbb")),
            Err(TopicRefusal::TooManyBytes { max: 10 })
        );
        t.subscribe(Bytes::from_static(b"bbb")).unwrap();
        // A duplicate costs nothing; a third distinct topic is refused.
        t.subscribe(Bytes::from_static(b"aaaa")).unwrap();
        assert_eq!(
            t.subscribe(Bytes::from_static(b"c")),
            Err(TopicRefusal::TooMany { max: 2 })
        );
        assert_eq!((t.len(), t.bytes()), (2, 7));
        t.cancel(b"bbb");
        t.subscribe(Bytes::from_static(b"c")).unwrap();
    }
}
