//! The input side every passive reader shares ([`crate::sniff::Sniffer`],
//! [`crate::salt_tcp::peek`], [`crate::salt_ws::peek`]): at most `budget` bytes of a stream are
//! taken, those not yet examined are held in a buffer whose capacity never exceeds the budget,
//! and the verdict is kept: once final, the buffer is freed and later bytes change nothing.

use bytes::BytesMut;

use crate::sniff::{GiveUp, Verdict, MIN_BUDGET};

/// The buffer a reader parses from: a `Vec` (the `tcp` and `ws` readers) or a `BytesMut` (the
/// ZeroMQ sniffer, whose frame decoder splits frames off it).
pub(crate) trait PeekBytes: Default {
    fn len(&self) -> usize;
    fn capacity(&self) -> usize;
    /// Makes room for exactly `cap` bytes in all (never more: the budget bounds the memory).
    fn grow_to(&mut self, cap: usize);
    fn extend_from_slice(&mut self, bytes: &[u8]);
}

impl PeekBytes for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
    fn grow_to(&mut self, cap: usize) {
        self.reserve_exact(cap - self.len());
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes)
    }
}

impl PeekBytes for BytesMut {
    fn len(&self) -> usize {
        BytesMut::len(self)
    }
    fn capacity(&self) -> usize {
        BytesMut::capacity(self)
    }
    fn grow_to(&mut self, cap: usize) {
        // `BytesMut::reserve` may take more than asked: a new buffer of exactly `cap`.
        let mut grown = BytesMut::with_capacity(cap);
        grown.extend_from_slice(self);
        *self = grown;
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        BytesMut::extend_from_slice(self, bytes)
    }
}

#[derive(Debug)]
pub(crate) struct BudgetBuf<B = Vec<u8>> {
    pub(crate) budget: usize,
    /// Bytes of the stream taken so far (at most `budget`).
    pub(crate) taken: usize,
    /// Taken bytes not yet examined; freed once the verdict is final.
    pub(crate) buf: B,
    verdict: Verdict,
}

impl<B: PeekBytes> BudgetBuf<B> {
    /// Takes the first `budget` bytes of a stream (at least [`MIN_BUDGET`]).
    pub(crate) fn new(budget: usize) -> Self {
        BudgetBuf {
            budget: budget.max(MIN_BUDGET),
            taken: 0,
            buf: B::default(),
            verdict: Verdict::Pending,
        }
    }

    /// Bytes of memory held right now (never more than the budget; 0 once the verdict is final).
    pub(crate) fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    pub(crate) fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Takes the next bytes of the stream and has `parse` examine what is buffered (`Some` once
    /// the verdict is known); returns the verdict so far. Once it is final, later calls return it
    /// at once. Still pending with the whole budget taken is [`GiveUp::OverBudget`].
    pub(crate) fn feed(
        &mut self,
        bytes: &[u8],
        parse: impl FnOnce(&mut Self) -> Option<Verdict>,
    ) -> &Verdict {
        if self.verdict.is_final() {
            return &self.verdict;
        }
        let spent = self.take(bytes);
        if let Some(v) = parse(self) {
            self.finish(v);
        } else if spent {
            // Waiting for bytes beyond the budget.
            self.finish(Verdict::GaveUp(GiveUp::OverBudget));
        }
        &self.verdict
    }

    /// Takes what fits of `bytes` in the budget; true once the whole budget is taken.
    fn take(&mut self, bytes: &[u8]) -> bool {
        let bytes = &bytes[..bytes.len().min(self.budget - self.taken)];
        // Grown by hand so that the capacity never exceeds the budget.
        let need = self.buf.len() + bytes.len();
        if need > self.buf.capacity() {
            let cap = need
                .max(self.buf.len() * 2)
                .max(1024)
                .min(self.budget)
                .max(need);
            self.buf.grow_to(cap);
        }
        self.buf.extend_from_slice(bytes);
        self.taken += bytes.len();
        self.taken == self.budget
    }

    /// The verdict is final: the buffer is freed.
    fn finish(&mut self, v: Verdict) {
        self.verdict = v;
        self.buf = B::default();
    }
}
