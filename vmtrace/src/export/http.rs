//! A small HTTP/1.1 responder for `/metrics` and `/healthz` on tokio.
//!
//! Hand-written rather than pulled in (hyper, axum) because it serves two GET paths: what matters
//! is that no client can hold anything up. Each connection is its own task with a deadline for
//! the request head and one for the response, the head is capped in size, the number of open
//! connections is capped (excess ones are closed at once), and every response closes the
//! connection. The render reads atomics, so a scrape never blocks the event thread, and a stuck
//! client only ever holds its own task.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::expo::CONTENT_TYPE;

/// Limits that keep slow or hostile clients cheap.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; more are closed on accept.
    pub max_connections: usize,
    /// Time a client has to send its whole request head.
    pub head_timeout: Duration,
    /// Time a client has to take the whole response.
    pub write_timeout: Duration,
    /// Largest request head accepted (request line and headers).
    pub max_head_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            head_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            max_head_bytes: 8 * 1024,
        }
    }
}

/// What the server answers with; implemented by the daemon (and by tests).
pub trait Handler: Send + Sync + 'static {
    /// The `/metrics` body.
    fn metrics(&self) -> String;
    /// `Ok(text)` when healthy, `Err(text)` for a 503.
    fn health(&self) -> Result<String, String>;
}

/// Serves until `shutdown` turns true; connections in flight finish on their own deadlines.
pub async fn serve(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else {
                    // EMFILE and the like: back off briefly instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    log::debug!("connection limit reached; closing a new connection");
                    continue;
                };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = connection(stream, handler.as_ref(), limits).await {
                        log::debug!("http connection: {e}");
                    }
                });
            }
        }
    }
}

/// A parsed request line.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    pub path: &'a str,
}

/// Parses the request line of a complete head; `None` when it is not HTTP/1.x.
pub fn parse_request_line(head: &str) -> Option<RequestLine<'_>> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let path = target.split('?').next().unwrap_or(target);
    Some(RequestLine { method, path })
}

/// Status, content type and body for a request.
pub fn respond(req: Option<RequestLine<'_>>, handler: &dyn Handler) -> (u16, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let Some(req) = req else {
        return (400, TEXT, "bad request\n".into());
    };
    if req.method != "GET" && req.method != "HEAD" {
        return (405, TEXT, "only GET and HEAD\n".into());
    }
    match req.path {
        "/metrics" => (200, CONTENT_TYPE, handler.metrics()),
        "/healthz" => match handler.health() {
            Ok(t) => (200, TEXT, t),
            Err(t) => (503, TEXT, t),
        },
        "/" => (
            200,
            TEXT,
            "vmtrace serve: metrics at /metrics, health at /healthz\n".into(),
        ),
        _ => (404, TEXT, "not found\n".into()),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Reads the head (up to the blank line), or `Err(status)` on timeout, size or EOF.
async fn read_head(stream: &mut TcpStream, limits: Limits) -> Result<Vec<u8>, u16> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 1024];
        loop {
            let n = stream.read(&mut chunk).await.map_err(|_| 400u16)?;
            if n == 0 {
                return Err(400);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
                return Ok(());
            }
            if buf.len() > limits.max_head_bytes {
                return Err(431);
            }
        }
    };
    match tokio::time::timeout(limits.head_timeout, read).await {
        Ok(Ok(())) => Ok(buf),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(408),
    }
}

async fn connection(
    mut stream: TcpStream,
    handler: &dyn Handler,
    limits: Limits,
) -> std::io::Result<()> {
    let (status, ctype, body, head_only) = match read_head(&mut stream, limits).await {
        Ok(head) => {
            let text = String::from_utf8_lossy(&head);
            let req = parse_request_line(&text);
            let head_only = req.as_ref().is_some_and(|r| r.method == "HEAD");
            let (s, c, b) = respond(req, handler);
            (s, c, b, head_only)
        }
        // The peer closed before a full head: nothing to answer.
        Err(400) => return Ok(()),
        Err(status) => (
            status,
            "text/plain; charset=utf-8",
            format!("{}\n", reason(status)),
            false,
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    let write = async {
        stream.write_all(&out).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(limits.write_timeout, write).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "client too slow to take the response",
        )),
    }
}
