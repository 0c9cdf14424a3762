//! `ceiling`: a bare hyper 1.x HTTP/1.1 server that reads each request body and
//! answers `200 {"ok":true}`. It does no work at all, so its throughput is the
//! "bare hyper ceiling" that hf3fs-meta's numbers are compared against: same
//! runtime shape as the server (tokio multi-thread, `--threads` workers,
//! TCP_NODELAY, keep-alive, mimalloc).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Bare hyper ceiling server: 200 {\"ok\":true} for any POST")]
struct Args {
    /// Address to listen on (loopback only in this project).
    #[arg(long, default_value = "127.0.0.1:18100")]
    addr: SocketAddr,
    /// Tokio worker threads (default: number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Exit by itself after this many seconds (0 = run until killed).
    #[arg(long, default_value_t = 0)]
    exit_after: u64,
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let post = req.method() == Method::POST;
    // Read the whole body, as the real server must, even though it is unused.
    let _ = req.into_body().collect().await;
    let (status, body): (_, &'static [u8]) = if post {
        (StatusCode::OK, br#"{"ok":true}"#)
    } else {
        (StatusCode::METHOD_NOT_ALLOWED, br#"{"detail":"Method Not Allowed"}"#)
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    Ok(resp)
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.addr).await?;
        eprintln!("ceiling listening on {} ({threads} threads)", listener.local_addr()?);
        if args.exit_after > 0 {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(args.exit_after)).await;
                eprintln!("ceiling: --exit-after reached, exiting");
                std::process::exit(0);
            });
        }
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(handle);
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}
