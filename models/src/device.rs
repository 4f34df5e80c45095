//! Where the forward pass runs: `cpu`, or `cuda:N` in builds with the `cuda` feature.

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
            Self::Cuda(n) => candle_core::Device::new_cuda(n)
                .map_err(|e| ModelError::Device(format!("cannot open cuda:{n}: {e}"))),
            #[cfg(not(feature = "cuda"))]
            Self::Cuda(n) => Err(ModelError::Device(format!(
                "cuda:{n} requested, but this binary was built without the `cuda` feature"
            ))),
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
    }
}
