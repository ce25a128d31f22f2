//! A write buffer that exists only while it holds bytes.
//!
//! It gathers small writes (a response's head and body) into one, as tokio's `BufWriter`
//! does, but its buffer is allocated by the first write after a flush and freed by the flush
//! that empties it. A keep-alive connection waiting for its next request then holds no write
//! buffer: 16 KiB per idle TLS connection otherwise. Its first allocation is small enough
//! for jemalloc's thread cache (see `gather`), about the cost of keeping one.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::AsyncWrite;

/// The buffer's first size: a usual response head and small body.
const FIRST_ALLOCATION: usize = 4096;

#[derive(Debug)]
pub(super) struct Gather<W> {
    inner: W,
    buf: Vec<u8>,
    /// How much of `buf` went out already (a flush the socket took part of).
    written: usize,
    /// Writes gathered up to this many bytes; a write this large goes straight through.
    capacity: usize,
}

impl<W: AsyncWrite + Unpin> Gather<W> {
    pub(super) fn new(capacity: usize, inner: W) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            written: 0,
            capacity,
        }
    }

    pub(super) fn get_ref(&self) -> &W {
        &self.inner
    }

    pub(super) fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Bytes gathered and not yet written.
    #[cfg(test)]
    pub(super) fn pending(&self) -> usize {
        self.buf.len() - self.written
    }

    /// Writes out what is gathered, then frees the buffer.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..])) {
                Ok(0) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the connection took no bytes",
                    )));
                }
                Ok(n) => self.written += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.buf = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes. The first allocation is as small as the write allows
    /// and grows with what is gathered: jemalloc serves up to 14 KiB from its thread cache,
    /// while a 16 KiB block (a TLS record's worth) per response went to the arena each time.
    fn gather(&mut self, len: usize) {
        if self.buf.capacity() == 0 {
            self.buf
                .reserve_exact(len.max(FIRST_ALLOCATION).min(self.capacity));
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Gather<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.buf.len() + buf.len() > this.capacity {
            ready!(this.poll_write_out(cx))?;
        }
        if buf.len() >= this.capacity {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        this.gather(buf.len());
        this.buf.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.buf.len() + total > this.capacity {
            ready!(this.poll_write_out(cx))?;
        }
        if total >= this.capacity {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        this.gather(total);
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_out(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_out(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_writes_leave_together_at_the_flush_and_the_buffer_is_freed() {
        let (a, mut b) = tokio::io::duplex(64 * 1024);
        let mut w = Gather::new(1460, a);
        w.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        w.write_all(b"Content-Length: 2\r\n\r\nok").await.unwrap();
        // Held, not written, until the flush.
        assert_eq!(w.pending(), 40);
        w.flush().await.unwrap();
        assert_eq!(w.buf.capacity(), 0, "a flushed buffer is freed");
        let mut all = [0u8; 40];
        b.read_exact(&mut all).await.unwrap();
        assert_eq!(&all, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }

    #[tokio::test]
    async fn a_write_past_the_capacity_goes_through_after_what_was_gathered() {
        let (a, mut b) = tokio::io::duplex(256 * 1024);
        let mut w = Gather::new(1460, a);
        w.write_all(b"head").await.unwrap();
        let body = vec![7u8; 100_000];
        w.write_all(&body).await.unwrap();
        assert_eq!(
            w.pending(),
            0,
            "a large write is not copied into the buffer"
        );
        w.flush().await.unwrap();
        let mut all = vec![0u8; 100_004];
        b.read_exact(&mut all).await.unwrap();
        assert_eq!(&all[..4], b"head");
        assert!(all[4..].iter().all(|&x| x == 7));
        // Vectored: gathered when small, in order with what came before.
        w.write_all(b"a").await.unwrap();
        let n = w
            .write_vectored(&[io::IoSlice::new(b"bc"), io::IoSlice::new(b"d")])
            .await
            .unwrap();
        assert_eq!(n, 3);
        w.shutdown().await.unwrap();
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"abcd");
    }
}
