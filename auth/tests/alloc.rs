//! A keyring read from a key file is polled in every housekeeping of the agent that holds it
//! (`KeyWatch`, once a millisecond, busy or idle): a poll within [`RELOAD_CHECK_EVERY`] of the last look allocates nothing,
//! and neither does a look that finds the file unchanged.

use std::time::Duration;

use seqstream_auth::key::RELOAD_CHECK_EVERY;
use seqstream_auth::Keyring;
use seqstream_testkit::{counted, write_key, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn polling_a_key_file_allocates_nothing_until_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    write_key(&path, "the allocation test's key material");
    let mut keys = Keyring::open(&path, Duration::from_secs(1)).unwrap();
    let every = RELOAD_CHECK_EVERY.as_nanos() as u64;
    assert!(keys.poll(0).unwrap().is_none(), "the first look: unchanged");
    let mut n = 0;
    counted(&mut n, || {
        for now in (1..=4 * every).step_by(1_000_000) {
            assert!(keys.poll(now).unwrap().is_none());
        }
    });
    assert_eq!(
        n, 0,
        "{n} allocations in 4 s of polls (three looks at an unchanged file)"
    );
    write_key(&path, "the allocation test's next key material");
    assert!(
        keys.poll(6 * every).unwrap().is_some(),
        "the changed file is read: the polls above looked at it"
    );
}
