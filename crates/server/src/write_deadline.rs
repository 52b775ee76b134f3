//! A connection whose writes make no progress for `--write-timeout` ends: a client that
//! pipelines requests and never reads the answers, or stops reading a stream, fills the socket's
//! buffers, and from then on each write waits; without a deadline it would hold its connection
//! slot forever. A slow reader still makes progress and is not cut; a stream whose next token is
//! slow writes nothing meanwhile and is not cut either (nothing waits to be written).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner` whose writes, flushes and shutdown fail with `TimedOut` once one has waited
/// `deadline` without any byte going out.
pub(crate) struct WriteDeadline<S> {
    inner: S,
    deadline: Duration,
    /// Set while a write waits; cleared by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(crate) fn new(inner: S, deadline: Duration) -> Self {
        Self { inner, deadline, stalled: None }
    }

    /// Called when the inner write is not ready: waits on the deadline as well.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let deadline = self.deadline;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(&mut self, result: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match result {
            Poll::Pending => self.waiting(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progressed(result, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progressed(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.progressed(result, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.progressed(result, cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_deadline() {
        let (_client, server) = tokio::io::duplex(1024);
        let mut server = WriteDeadline::new(server, Duration::from_millis(200));
        let stuck = tokio::time::timeout(Duration::from_secs(10), server.write_all(&[b'x'; 4096])).await;
        let error = stuck.expect("the write gave up by itself").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_slow_reader_keeps_the_writer_going_past_the_deadline() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut server = WriteDeadline::new(server, Duration::from_millis(200));
        let reader = tokio::spawn(async move {
            let (mut got, mut buf) = (0, [0u8; 512]);
            while got < 16 * 1024 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                got += client.read(&mut buf).await.unwrap();
            }
        });
        // 16 KiB through a 1 KiB pipe at 512 bytes per 50 ms: 1.6 s, eight deadlines long.
        server.write_all(&[b'y'; 16 * 1024]).await.expect("a slow reader is not cut");
        reader.await.unwrap();
    }
}
