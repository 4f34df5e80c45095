//! Reading GGUF files: metadata look-ups with typed errors, and tensors dequantized to f32.
//!
//! candle-core's `gguf_file` does the parsing; this module adds what a loader needs on top: the
//! file path in every error, metadata accessors that say which key is missing, and a check of
//! tensor types against the list this runtime can run.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::Device;

use crate::error::{ModelError, Result};

/// Tensor types whose dequantization this runtime has checked against llama.cpp.
const SUPPORTED_TYPES: &[GgmlDType] = &[
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// An open GGUF file: its parsed header and a reader for tensor data.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

/// A dense f32 matrix in row-major order, `rows × cols` (GGUF stores `[cols, rows]`).
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl GgufFile {
    /// Opens and parses the header of a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|source| ModelError::Gguf {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            content,
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    fn get(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| ModelError::Metadata(format!("missing key '{key}'")))
    }

    fn typed<T>(&self, key: &str, value: candle_core::Result<T>) -> Result<T> {
        value.map_err(|e| ModelError::Metadata(format!("key '{key}': {e}")))
    }

    pub fn has(&self, key: &str) -> bool {
        self.content.metadata.contains_key(key)
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        let v = self.get(key)?;
        self.typed(key, v.to_string()).map(String::as_str)
    }

    /// An unsigned integer of any width (GGUF writers differ in which one they use).
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        let n = match v {
            Value::U8(x) => u64::from(*x),
            Value::U16(x) => u64::from(*x),
            Value::U32(x) => u64::from(*x),
            Value::U64(x) => *x,
            Value::I8(x) if *x >= 0 => *x as u64,
            Value::I16(x) if *x >= 0 => *x as u64,
            Value::I32(x) if *x >= 0 => *x as u64,
            Value::I64(x) if *x >= 0 => *x as u64,
            other => {
                return Err(ModelError::Metadata(format!(
                    "key '{key}': expected an unsigned integer, found {:?}",
                    other.value_type()
                )))
            }
        };
        usize::try_from(n).map_err(|_| ModelError::Metadata(format!("key '{key}': {n} too large")))
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        match self.get(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            other => Err(ModelError::Metadata(format!(
                "key '{key}': expected a float, found {:?}",
                other.value_type()
            ))),
        }
    }

    /// The shape of a tensor as candle reports it (outermost first: `[rows, cols]` for matrices).
    pub fn tensor_dims(&self, name: &str) -> Result<Vec<usize>> {
        let info = self.tensor_info(name)?;
        Ok(info.shape.dims().to_vec())
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn tensor_info(&self, name: &str) -> Result<&candle_core::quantized::gguf_file::TensorInfo> {
        self.content.tensor_infos.get(name).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{}: tensor '{name}' is missing",
                self.path.display()
            ))
        })
    }

    /// Checks every tensor's type before any is loaded, so a file with an unsupported type
    /// fails at once with the tensor's name rather than half-way through loading.
    pub fn check_tensor_types(&self) -> Result<()> {
        let mut names: Vec<&String> = self.content.tensor_infos.keys().collect();
        names.sort();
        for name in names {
            let dtype = self.content.tensor_infos[name].ggml_dtype;
            if !SUPPORTED_TYPES.contains(&dtype) {
                return Err(ModelError::Unsupported(format!(
                    "tensor '{name}' has type {dtype:?}; supported: {SUPPORTED_TYPES:?}"
                )));
            }
        }
        Ok(())
    }

    pub fn read_qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        self.tensor_info(name)?;
        let info = &self.content.tensor_infos[name];
        info.read(
            &mut self.reader,
            self.content.tensor_data_offset,
            &Device::Cpu,
        )
        .map_err(|source| ModelError::Gguf {
            path: self.path.clone(),
            source,
        })
    }
}

impl Matrix {
    /// Stacks matrices with the same column count on top of each other (fusing Q, K and V, or
    /// gate and up, into one product over the same input).
    pub fn stack(parts: Vec<Matrix>) -> Result<Matrix> {
        let cols = parts.first().map_or(0, |m| m.cols);
        if parts.iter().any(|m| m.cols != cols) {
            return Err(ModelError::Unsupported(
                "fused projections must share their input width".into(),
            ));
        }
        let rows = parts.iter().map(|m| m.rows).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for m in parts {
            data.extend_from_slice(&m.data);
        }
        Ok(Matrix { rows, cols, data })
    }
}

impl crate::weights::WeightSource for GgufFile {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn has_tensor(&self, name: &str) -> bool {
        GgufFile::has_tensor(self, name)
    }

    fn tensor_dims(&self, name: &str) -> Result<Vec<usize>> {
        GgufFile::tensor_dims(self, name)
    }

    fn read_qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        GgufFile::read_qtensor(self, name)
    }

    fn check_tensor_types(&self) -> Result<()> {
        GgufFile::check_tensor_types(self)
    }
}
