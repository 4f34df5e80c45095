//! Just enough of the GGUF format to read a model file's metadata (the `tokenizer.ggml.*` keys)
//! without depending on a model crate: the header and the key/value section, read through a
//! buffer so a multi-gigabyte file costs only its first few megabytes. Tensor data is never
//! touched.
//!
//! Layout (GGUF v2/v3, little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64`
//! key/value count, then per key a length-prefixed UTF-8 string, a `u32` type tag and the value.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// One metadata value. Integers of every width are widened; arrays keep their items.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Guards against a corrupt length turning into a huge allocation: no GGUF string or array we
/// read (vocabularies included) comes near this.
const MAX_LEN: u64 = 1 << 28;
/// Nested arrays deeper than this are not GGUF metadata.
const MAX_DEPTH: u32 = 4;

struct Reader<R> {
    inner: R,
    path: std::path::PathBuf,
}

impl<R: Read> Reader<R> {
    fn bad(&self, reason: impl Into<String>) -> Error {
        Error::Tokenizer {
            path: self.path.clone(),
            reason: format!("GGUF metadata: {}", reason.into()),
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| self.bad(format!("truncated metadata ({e})")))?;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        if n > MAX_LEN {
            return Err(self.bad(format!("implausible length {n}")));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let mut b = vec![0u8; n];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| self.bad(format!("truncated string ({e})")))?;
        String::from_utf8(b).map_err(|_| self.bad("a string is not UTF-8"))
    }

    fn value(&mut self, tag: u32, depth: u32) -> Result<Value> {
        Ok(match tag {
            0 => Value::Int(i64::from(self.bytes::<1>()?[0])),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => Value::Int(i64::from(u16::from_le_bytes(self.bytes()?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => Value::Int(i64::from(self.u32()?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.bad("arrays nested too deep"));
                }
                let item = self.u32()?;
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(item, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::Int(self.u64()? as i64),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            other => return Err(self.bad(format!("unknown value type {other}"))),
        })
    }
}

/// Reads the metadata of the GGUF file at `path`.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, Value>> {
    let file = std::fs::File::open(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    read_metadata_from(BufReader::with_capacity(1 << 20, file), path)
}

/// Reads GGUF metadata from any reader (`path` only names it in errors).
pub fn read_metadata_from(inner: impl Read, path: &Path) -> Result<HashMap<String, Value>> {
    let mut r = Reader {
        inner,
        path: path.to_owned(),
    };
    if &r.bytes::<4>()? != b"GGUF" {
        return Err(r.bad("not a GGUF file (no `GGUF` magic)"));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(r.bad(format!("version {version} (2 and 3 are read)")));
    }
    let _tensors = r.u64()?;
    let kvs = r.u64()?;
    if kvs > MAX_LEN {
        return Err(r.bad(format!("implausible key count {kvs}")));
    }
    let mut out = HashMap::new();
    for _ in 0..kvs {
        let key = r.string()?;
        let tag = r.u32()?;
        let v = r.value(tag, 0)?;
        out.insert(key, v);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GGUF v3 header with the given metadata (tag, key, encoded value bytes).
    pub(crate) fn encode(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, tag, v) in kvs {
            b.extend(str_bytes(k));
            b.extend(tag.to_le_bytes());
            b.extend(v);
        }
        b
    }

    pub(crate) fn str_bytes(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend(s.as_bytes());
        b
    }

    pub(crate) fn str_array(items: &[&str]) -> Vec<u8> {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((items.len() as u64).to_le_bytes());
        for s in items {
            b.extend(str_bytes(s));
        }
        b
    }

    #[test]
    fn reads_every_scalar_and_arrays() {
        let bytes = encode(&[
            ("a.str", 8, str_bytes("gpt2")),
            ("a.u32", 4, 7u32.to_le_bytes().to_vec()),
            ("a.i8", 1, vec![0xff]),
            ("a.bool", 7, vec![1]),
            ("a.f32", 6, 0.5f32.to_le_bytes().to_vec()),
            ("a.u64", 10, 9u64.to_le_bytes().to_vec()),
            ("a.arr", 9, str_array(&["x", "yz"])),
        ]);
        let md = read_metadata_from(&bytes[..], Path::new("t.gguf")).unwrap();
        assert_eq!(md["a.str"].as_str(), Some("gpt2"));
        assert_eq!(md["a.u32"].as_int(), Some(7));
        assert_eq!(md["a.i8"].as_int(), Some(-1));
        assert_eq!(md["a.bool"].as_bool(), Some(true));
        assert_eq!(md["a.f32"], Value::Float(0.5));
        assert_eq!(md["a.u64"].as_int(), Some(9));
        let arr: Vec<_> = md["a.arr"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(arr, ["x", "yz"]);
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        let e = read_metadata_from(&b"GGML...."[..], Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        let mut bytes = encode(&[("k", 8, str_bytes("value"))]);
        bytes.truncate(bytes.len() - 2);
        let e = read_metadata_from(&bytes[..], Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        let bytes = encode(&[("k", 8, u64::MAX.to_le_bytes().to_vec())]);
        let e = read_metadata_from(&bytes[..], Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("implausible"), "{e}");
        let bytes = encode(&[("k", 42, vec![])]);
        assert!(read_metadata_from(&bytes[..], Path::new("x")).is_err());
    }
}
