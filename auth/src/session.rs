//! The tag on every replication message after the handshake: the message's SBE bytes, then a
//! [`TAG_LEN`]-byte tag under the direction's session key over the message and its implicit
//! counter (messages this direction has carried before it, from 0).
//!
//! The counter is never sent: both ends count. So a man in the middle that changes, drops,
//! repeats or reorders one message, or splices in one from another session, makes the next tag
//! fail, and the session ends before the message is used.

use crate::{Key, Tag, TAG_LEN};

/// Why a session message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// Shorter than a tag.
    #[error("message {counter}: {len} bytes, too short for its tag")]
    Short {
        /// The message's counter.
        counter: u64,
        /// Its length.
        len: usize,
    },
    /// Its tag is wrong: it was changed, dropped, repeated, reordered or forged.
    #[error("message {counter}: bad tag (changed, dropped, repeated or forged on the way)")]
    BadTag {
        /// The message's counter.
        counter: u64,
    },
}

/// One direction of a session: its key and the counter of its next message.
#[derive(Debug, Clone)]
pub struct SessionMac {
    key: Key,
    counter: u64,
}

impl SessionMac {
    pub(crate) fn new(key: Key) -> SessionMac {
        SessionMac { key, counter: 0 }
    }

    /// The tag of the next message, `parts` in order; the counter moves on.
    pub fn tag(&mut self, parts: &[&[u8]]) -> Tag {
        let hash = crate::mac::keyed_hash(self.key_bytes(), &self.counter.to_le_bytes(), parts);
        self.counter += 1;
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&hash.as_bytes()[..TAG_LEN]);
        tag
    }

    /// Checks the next message, `msg` being its bytes and then its tag; its bytes without the
    /// tag. The counter moves on only when it verifies.
    pub fn open<'a>(&mut self, msg: &'a [u8]) -> Result<&'a [u8], SessionError> {
        let counter = self.counter;
        let len = msg.len().checked_sub(TAG_LEN).ok_or(SessionError::Short {
            counter,
            len: msg.len(),
        })?;
        let (body, tag) = msg.split_at(len);
        self.open_parts(&[body], tag)?;
        Ok(body)
    }

    /// Checks the next message whose bytes are `parts` in order (received in pieces, one of
    /// them straight into a store) against its `tag`. The counter moves on only when it
    /// verifies.
    ///
    /// Errors: `BadTag` when it does not, `Short` when `tag` is not [`TAG_LEN`] bytes.
    pub fn open_parts(&mut self, parts: &[&[u8]], tag: &[u8]) -> Result<(), SessionError> {
        let counter = self.counter;
        if tag.len() != TAG_LEN {
            return Err(SessionError::Short {
                counter,
                len: tag.len(),
            });
        }
        let mut check = self.clone();
        if !crate::mac::tags_equal(&check.tag(parts), tag) {
            return Err(SessionError::BadTag { counter });
        }
        *self = check;
        Ok(())
    }

    /// Messages tagged or opened so far.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    fn key_bytes(&self) -> &[u8; 32] {
        self.key.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_dropped_repeated_and_reordered_messages_are_refused() {
        let key = Key::from_material(b"session key 0123456789");
        let mut tx = SessionMac::new(key.clone());
        let msgs: Vec<Vec<u8>> = (0..4u8)
            .map(|i| {
                let mut m = vec![i; 10 + i as usize];
                let t = tx.tag(&[&m[..5], &m[5..]]);
                m.extend_from_slice(&t);
                m
            })
            .collect();
        let fresh = || SessionMac::new(key.clone());
        let mut rx = fresh();
        for m in &msgs {
            assert_eq!(rx.open(m).unwrap(), &m[..m.len() - TAG_LEN]);
        }
        let mut rx = fresh();
        rx.open(&msgs[0]).unwrap();
        assert_eq!(
            rx.open(&msgs[0]),
            Err(SessionError::BadTag { counter: 1 }),
            "repeated"
        );
        assert_eq!(
            rx.open(&msgs[2]),
            Err(SessionError::BadTag { counter: 1 }),
            "one dropped"
        );
        rx.open(&msgs[1]).unwrap();
        let mut changed = msgs[2].clone();
        changed[3] ^= 1;
        assert_eq!(rx.open(&changed), Err(SessionError::BadTag { counter: 2 }));
        assert_eq!(
            rx.open(&[1, 2]),
            Err(SessionError::Short { counter: 2, len: 2 })
        );
        let mut other = SessionMac::new(Key::from_material(b"other session 0123456"));
        let mut m = b"abc".to_vec();
        let t = other.tag(&[&m]);
        m.extend_from_slice(&t);
        assert!(fresh().open(&m).is_err(), "a message of another session");
    }

    #[test]
    fn a_message_received_in_pieces_opens_as_a_whole() {
        let key = Key::from_material(b"session key 0123456789");
        let mut tx = SessionMac::new(key.clone());
        let body = b"a prefix, then data read elsewhere";
        let tag = tx.tag(&[body]);
        let mut rx = SessionMac::new(key);
        assert_eq!(
            rx.open_parts(&[&body[..9], &body[9..]], &tag[..TAG_LEN - 1]),
            Err(SessionError::Short {
                counter: 0,
                len: TAG_LEN - 1
            })
        );
        let mut changed = tag;
        changed[0] ^= 1;
        assert_eq!(
            rx.open_parts(&[&body[..9], &body[9..]], &changed),
            Err(SessionError::BadTag { counter: 0 })
        );
        assert_eq!(rx.open_parts(&[&body[..9], &body[9..]], &tag), Ok(()));
        assert_eq!(rx.counter(), 1);
    }
}
