//! Empty: this package holds only the `gpu_conformance` test target.
