//! Any bytes as a capture file: opening and reading every record must end, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seqstream_feeds::capture::{Capture, CaptureError};

fuzz_target!(|data: &[u8]| {
    let Ok(mut capture) = Capture::from_reader(data, "fuzz") else {
        return;
    };
    let mut frames = 0usize;
    while let Some(record) = capture.next_record() {
        match record {
            Ok(record) => assert_eq!(record.frame, frames),
            Err(CaptureError::BadFrame { frame, .. } | CaptureError::LinkType { frame, .. }) => {
                assert_eq!(frame, frames)
            }
            Err(_) => break,
        }
        frames += 1;
    }
    assert!(capture.next_record().is_none());
});
