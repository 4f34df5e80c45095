//! Where the forward pass runs (`cpu`, or `cuda:N` in builds with the `cuda` feature) and with
//! which backend (the CPU kernels, or candle's tensors).

use std::fmt;
use std::str::FromStr;

use crate::error::ModelError;

/// A device named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Self::Cuda(n)),
                _ => Err(ModelError::Device(format!(
                    "unknown device '{other}': expected 'cpu', 'cuda' or 'cuda:N'"
                ))),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// Opens the device through candle, failing clearly where this build or machine lacks it.
    pub fn open(self) -> Result<candle_core::Device, ModelError> {
        match self {
            Self::Cpu => Ok(candle_core::Device::Cpu),
            #[cfg(feature = "cuda")]
            Self::Cuda(n) => open_cuda(n, crate::candle::cuda_graphs_from_env())
                .map_err(|e| ModelError::Device(format!("cannot open cuda:{n}: {e}"))),
            #[cfg(not(feature = "cuda"))]
            Self::Cuda(n) => Err(ModelError::Device(format!(
                "cuda:{n} requested, but this binary was built without the `cuda` feature"
            ))),
        }
    }
}

/// Opens GPU `n` on candle's per-thread stream, or, for decode steps captured as CUDA graphs
/// (`graphs`), on a stream of its own, which a capture needs, with cudarc's cross-stream event
/// tracking off: every tensor lives on that one stream, and a capture cannot wait on events
/// recorded outside it.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
fn open_cuda(n: usize, graphs: bool) -> candle_core::Result<candle_core::Device> {
    if !graphs {
        return candle_core::Device::new_cuda(n);
    }
    let device = candle_core::Device::new_cuda_with_stream(n)?;
    if let candle_core::Device::Cuda(d) = &device {
        // SAFETY: called before any tensor exists on the device, and all of them are used on
        // its one stream, so no cross-stream ordering is left to events.
        unsafe { d.disable_event_tracking() };
    }
    Ok(device)
}

/// Which implementation of the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The hand-written CPU kernels (`crate::kernels`): the CPU default.
    #[default]
    Kernels,
    /// candle tensors (`crate::candle`): the only backend on a GPU, testable on the CPU.
    Candle,
}

impl FromStr for Backend {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "kernels" => Ok(Self::Kernels),
            "candle" => Ok(Self::Candle),
            other => Err(ModelError::Device(format!(
                "unknown backend '{other}': expected 'kernels' or 'candle'"
            ))),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kernels => write!(f, "kernels"),
            Self::Candle => write!(f, "candle"),
        }
    }
}

impl Backend {
    /// The backend for a device when the command line may or may not name one: a GPU implies
    /// candle, the CPU defaults to the kernels, and the kernels on a GPU are refused.
    pub fn resolve(requested: Option<Self>, device: DeviceSpec) -> Result<Self, ModelError> {
        match (requested, device) {
            (Some(Self::Kernels), DeviceSpec::Cuda(_)) => Err(ModelError::Device(format!(
                "--backend kernels runs on the CPU only; {device} needs --backend candle \
                 (or no --backend)"
            ))),
            (Some(b), _) => Ok(b),
            (None, DeviceSpec::Cuda(_)) => Ok(Self::Candle),
            (None, DeviceSpec::Cpu) => Ok(Self::Kernels),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_device_names() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert!("gpu".parse::<DeviceSpec>().is_err());
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
        assert_eq!(DeviceSpec::Cuda(1).to_string(), "cuda:1");
        let err = "gpu".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("unknown device 'gpu'"), "{err}");
    }

    #[test]
    fn parses_and_resolves_the_backends() {
        assert_eq!("kernels".parse::<Backend>().unwrap(), Backend::Kernels);
        assert_eq!("candle".parse::<Backend>().unwrap(), Backend::Candle);
        let err = "torch".parse::<Backend>().unwrap_err().to_string();
        assert!(err.contains("unknown backend 'torch'"), "{err}");
        let cuda = DeviceSpec::Cuda(0);
        assert_eq!(Backend::resolve(None, cuda).unwrap(), Backend::Candle);
        assert_eq!(
            Backend::resolve(None, DeviceSpec::Cpu).unwrap(),
            Backend::Kernels
        );
        assert_eq!(
            Backend::resolve(Some(Backend::Candle), DeviceSpec::Cpu).unwrap(),
            Backend::Candle
        );
        let err = Backend::resolve(Some(Backend::Kernels), cuda)
            .unwrap_err()
            .to_string();
        assert!(err.contains("CPU only") && err.contains("cuda:0"), "{err}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let err = DeviceSpec::Cuda(0).open().unwrap_err().to_string();
        assert!(err.contains("built without the `cuda` feature"), "{err}");
    }
}
