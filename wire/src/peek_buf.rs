//! The input side the transport peekers share ([`crate::salt_tcp::peek`],
//! [`crate::salt_ws::peek`]): at most `budget` bytes of a stream are taken, and those not yet
//! examined are held in a vector whose capacity never exceeds the budget.

#[derive(Debug)]
pub(crate) struct BudgetBuf {
    pub(crate) budget: usize,
    /// Bytes of the stream taken so far (at most `budget`).
    pub(crate) taken: usize,
    /// Taken bytes not yet examined; freed once the peeker's verdict is final.
    pub(crate) buf: Vec<u8>,
}

impl BudgetBuf {
    pub(crate) fn new(budget: usize) -> Self {
        BudgetBuf {
            budget,
            taken: 0,
            buf: Vec::new(),
        }
    }

    /// Bytes of memory held right now.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Takes what fits of `bytes` in the budget; true once the whole budget is taken.
    pub(crate) fn take(&mut self, bytes: &[u8]) -> bool {
        let bytes = &bytes[..bytes.len().min(self.budget - self.taken)];
        // Grown by hand so that the capacity never exceeds the budget.
        let need = self.buf.len() + bytes.len();
        if need > self.buf.capacity() {
            let cap = need
                .max(self.buf.len() * 2)
                .max(1024)
                .min(self.budget)
                .max(need);
            self.buf.reserve_exact(cap - self.buf.len());
        }
        self.buf.extend_from_slice(bytes);
        self.taken += bytes.len();
        self.taken == self.budget
    }

    /// Frees the buffer (the verdict is final).
    pub(crate) fn free(&mut self) {
        self.buf = Vec::new();
    }
}
