//! Empty library target: it lets `vmtrace` declare a build-dependency on this crate, so cargo
//! rebuilds the embedded probes when this crate changes. The programs live in the binary target.
#![no_std]
