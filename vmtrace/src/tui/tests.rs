//! State and render tests for `vmtrace top`, with fixed data and no terminal.
