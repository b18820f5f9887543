//! The follower's timeouts and reconnect delay run on the clock it is given (issue 11,
//! class 5): a silent upstream is left only when the injected monotonic clock says so, however
//! the wall clock moves and however little real time passed. Here the upstream never answers
//! the hello (the handshake timeout, 5 s); `client_agent.rs` steps every timeout one by one.
//! With a sequencer group's members as upstreams, a refusal moves to the next member at once
//! and only a whole round of refusals waits the backoff.

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::{AgentRunner, RunnerConfig};
use seqstream_replication::follower::{Follower, FollowerConfig};
use seqstream_testkit::wait_counter;

/// Waits (bounded, real time) for the next connection.
fn accept_within(l: &TcpListener, within: Duration) -> Option<std::net::TcpStream> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok((s, _)) = l.accept() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_silent_upstream_is_left_when_monotonic_time_says_so() {
    let d = tempfile::tempdir().unwrap();
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    upstream.set_nonblocking(true).unwrap();
    let hour = 3_600_000_000_000u64;
    let clock = ManualClock::new(10 * hour, 0);
    let stop_on_drop = start_follower(d.path(), &[&upstream], &clock);

    let first = accept_within(&upstream, Duration::from_secs(20)).expect("no first connection");
    clock.set_realtime(hour);
    assert!(
        accept_within(&upstream, Duration::from_millis(300)).is_none(),
        "reconnected although the peer timeout has not passed on its clock"
    );
    clock.advance(5_001_000_000);
    // The session ends; the reconnect delay (50 ms) then runs on the same clock, which the
    // test moves on in steps until the follower is back (in far less than 5 s of real time).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut second = None;
    while second.is_none() && Instant::now() < deadline {
        clock.advance(60_000_000);
        second = accept_within(&upstream, Duration::from_millis(20));
    }
    assert!(
        second.is_some(),
        "the peer timeout and the reconnect delay passed on its clock: it must reconnect"
    );
    drop((first, second, stop_on_drop));
}

#[test]
fn a_group_member_that_refuses_is_followed_at_once_by_the_next_and_only_a_round_waits() {
    let d = tempfile::tempdir().unwrap();
    let members: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    for m in &members {
        m.set_nonblocking(true).unwrap();
    }
    let clock = ManualClock::new(3_600_000_000_000, 0);
    let _stop_on_drop = start_follower(d.path(), &[&members[0], &members[1]], &clock);

    // Each member closes the connection at once, as one that does not lead refuses a
    // consumer. The clock stands still: only what needs no delay happens.
    drop(accept_within(&members[0], Duration::from_secs(20)).expect("no first connection"));
    drop(
        accept_within(&members[1], Duration::from_secs(20))
            .expect("the next member must be tried at once, without a backoff"),
    );
    // Both refusals counted: the backoff started on the clock as it stands, before it moves.
    wait_counter(
        &d.path().join("f.counters"),
        "session errors",
        Duration::from_secs(20),
        |v| v >= 2,
    );
    assert!(
        accept_within(&members[0], Duration::from_millis(300)).is_none(),
        "a whole round failed: the next one waits the backoff"
    );
    clock.advance(50_000_000);
    assert!(
        accept_within(&members[0], Duration::from_secs(20)).is_some(),
        "the backoff passed on its clock"
    );
}

/// A follower of `upstreams` (the first, then the others as its alternates) into a replica
/// in `dir`, its intervals on `clock`, on a runner of its own.
fn start_follower(dir: &Path, upstreams: &[&TcpListener], clock: &ManualClock) -> StopOnDrop {
    let addr = |l: &&TcpListener| l.local_addr().unwrap();
    let mut cfg = FollowerConfig::new(
        dir.join("replica"),
        9,
        addr(&upstreams[0]),
        seqstream_auth::Keyring::fixed(seqstream_auth::Key::from_material(b"the clock test key")),
    );
    cfg.alternates = upstreams[1..].iter().map(addr).collect();
    cfg.store_config = cfg.store_config.clone().clock(clock.clock());
    let w = CountersWriter::create(&dir.join("f.counters"), 64).unwrap();
    let follower = Follower::new(cfg, &w).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let runner = AgentRunner::start(follower, RunnerConfig::default(), stop.clone()).unwrap();
    StopOnDrop(stop, Some(runner))
}

/// Stops and joins the follower's runner even when the test fails.
struct StopOnDrop(Arc<AtomicBool>, Option<AgentRunner>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}
