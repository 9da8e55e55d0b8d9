//! Heap bytes a Publisher holds per idle, subscribed connection, measured with a counting global
//! allocator (its own test binary: the allocator counts the whole process).
//!
//! Clients are bare TCP streams that write a greeting, READY and SUBSCRIBE and then stay silent;
//! their own cost is measured separately against a listener that only holds accepted sockets,
//! and subtracted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use saltgate_wire::zmtp::{Command, Greeting, Properties, PubOptions, Publisher};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const N: usize = 200;
const T: Duration = Duration::from_secs(20);

fn hello() -> Vec<u8> {
    let mut b = BytesMut::new();
    b.extend_from_slice(&Greeting::ours(false).encode());
    Command::Ready(Properties::default().with("Socket-Type", "SUB")).encode_frame(&mut b);
    Command::Subscribe(Bytes::new()).encode_frame(&mut b);
    b.to_vec()
}

async fn clients(addr: SocketAddr) -> Vec<TcpStream> {
    let hello = hello();
    let mut v = Vec::with_capacity(N);
    for _ in 0..N {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&hello).await.unwrap();
        v.push(s);
    }
    v
}

/// Waits until the live heap stops changing (tasks settle), then returns it.
async fn settled() -> isize {
    let mut last = LIVE.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = LIVE.load(Ordering::SeqCst);
        if (now - last).abs() < 1024 {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_subscribed_connection_holds_no_read_buffer() {
    // Client cost: the same clients against a listener that only keeps the sockets.
    let bare = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bare_addr = bare.local_addr().unwrap();
    let holder =
        std::thread::spawn(move || (0..N).map(|_| bare.accept().unwrap().0).collect::<Vec<_>>());
    let base = settled().await;
    let c = clients(bare_addr).await;
    let held = holder.join().unwrap();
    let client_cost = (settled().await - base) / N as isize;
    drop(c);
    drop(held);

    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), PubOptions::default())
        .await
        .unwrap();
    let base = settled().await;
    let c = clients(publisher.local_addr()).await;
    assert!(publisher.wait_for_subscribed(N, T).await);
    let total = (settled().await - base) / N as isize;
    let per_conn = total - client_cost;
    println!("idle subscribed PUB connection: {per_conn} heap bytes (clients: {client_cost})");
    // The 8 KiB read buffer alone used to exceed this.
    assert!(per_conn < 8 * 1024, "{per_conn} bytes per idle connection");
    drop(c);
}
