//! Prefix affinity: which replica "owns" a prompt's prefix, so requests sharing it land where
//! the prefix is already in the KV cache.
//!
//! The gateway may have no tokenizer for a remote model, so the key is taken from the prompt
//! as text (chat messages rendered as `role\ncontent\n`, in order) or from its token ids as
//! bytes: the leading bytes cut to whole [`BLOCK`]-byte blocks, at most `prefix_bytes`, hashed
//! (FNV-1a, stable across processes so several gateways agree). A prompt shorter than one
//! block is hashed whole. Requests that share their first `prefix_bytes` bytes therefore share
//! a key, whatever follows.
//!
//! Keys map to replicas by rendezvous (highest-random-weight) hashing: every replica gets a
//! weight `mix(key, replica)` and the ranking is by weight. It is consistent hashing without
//! a ring: when a replica leaves only its keys move, when one joins it takes about `1/N` of
//! the keys, and the ranking gives the bounded-load rule its fallbacks in a stable order.

use crate::router::remote::ReplicaUrl;

/// Bytes per hashed block (16 tokens of 4 bytes when the prompt is token ids).
pub const BLOCK: usize = 64;

/// FNV-1a over bytes.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A finaliser (splitmix64) so weights of nearby keys are unrelated.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The affinity key of a prompt's leading bytes; `None` for an empty prompt.
pub fn prefix_key(prompt: &[u8], prefix_bytes: usize) -> Option<u64> {
    if prompt.is_empty() {
        return None;
    }
    let limit = prefix_bytes.max(BLOCK) / BLOCK * BLOCK;
    let len = if prompt.len() < BLOCK {
        prompt.len()
    } else {
        (prompt.len() / BLOCK * BLOCK).min(limit)
    };
    Some(fnv1a(&prompt[..len]))
}

/// The key of an `x-session-id`: a session sticks to one replica.
pub fn session_key(session: &str) -> u64 {
    // Distinct from a prompt that happens to equal the session id.
    mix(fnv1a(session.as_bytes()) ^ 0x5e55_1011)
}

/// The rendezvous weight of `replica` for `key`.
pub fn weight(key: u64, replica: &ReplicaUrl) -> u64 {
    mix(key ^ fnv1a(replica.as_str().as_bytes()))
}

/// Chat messages as the text affinity hashes.
pub fn chat_text<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (role, content) in messages {
        out.extend_from_slice(role.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(content.as_bytes());
        out.push(b'\n');
    }
    out
}

/// Token ids as the bytes affinity hashes.
pub fn token_bytes(ids: &[i64]) -> Vec<u8> {
    ids.iter().flat_map(|&t| (t as u32).to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_only_on_the_leading_blocks() {
        let system = "s".repeat(600);
        let a = format!("{system} question one");
        let b = format!("{system} a different question");
        assert_eq!(prefix_key(a.as_bytes(), 512), prefix_key(b.as_bytes(), 512));
        let other = format!("t{}", &a[1..]);
        assert_ne!(
            prefix_key(a.as_bytes(), 512),
            prefix_key(other.as_bytes(), 512)
        );
        // Short prompts are hashed whole; a partial last block is left out.
        assert_ne!(prefix_key(b"hi", 512), prefix_key(b"ho", 512));
        let x = "x".repeat(BLOCK);
        assert_eq!(
            prefix_key(format!("{x}abc").as_bytes(), 512),
            prefix_key(format!("{x}xyz").as_bytes(), 512)
        );
        assert_eq!(prefix_key(b"", 512), None);
    }

    #[test]
    fn rendezvous_moves_only_the_keys_of_a_removed_replica() {
        let urls: Vec<ReplicaUrl> = (0..4)
            .map(|i| ReplicaUrl::parse(&format!("http://10.0.0.{i}:8000")).unwrap())
            .collect();
        let owner = |key: u64, set: &[ReplicaUrl]| {
            set.iter().max_by_key(|u| weight(key, u)).unwrap().clone()
        };
        let mut counts = [0usize; 4];
        let mut moved = 0;
        for k in 0..4000u64 {
            let key = fnv1a(&k.to_le_bytes());
            let before = owner(key, &urls);
            counts[urls.iter().position(|u| *u == before).unwrap()] += 1;
            let after = owner(key, &urls[..3]);
            if before != after {
                moved += 1;
                assert_eq!(before, urls[3], "only the removed replica's keys move");
            }
        }
        assert_eq!(moved, counts[3]);
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread: {counts:?}");
        }
    }

    #[test]
    fn chat_and_token_prompts_have_stable_bytes() {
        assert_eq!(
            chat_text([("system", "be brief"), ("user", "hi")]),
            b"system\nbe brief\nuser\nhi\n"
        );
        assert_eq!(token_bytes(&[1, 256]), vec![1, 0, 0, 0, 0, 1, 0, 0]);
        assert_ne!(session_key("abc"), fnv1a(b"abc"));
    }
}
