//! Kernels the user brings: the types every backend shares. A kernel is compiled from OpenCL C
//! (`opencl/user.rs`) or CUDA C (`cuda/user.rs`) source once per device, or is a Rust closure
//! over host slices on the `cpu` device (`cpu/user.rs`); `dispatch/user.rs` picks the backend.
//! The checks and the ordering of a launch live in the device layer
//! ([`crate::device::UserKernel`]).

use std::fmt;
use std::sync::Arc;

pub use super::grid::Grid;
pub(crate) use super::grid::GridLimits;

use super::cpu::user::HostKernelFn;

/// The type of a scalar argument, named as OpenCL C names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScalarType {
    /// `int` (`i32`).
    I32,
    /// `uint`, `unsigned int` (`u32`).
    U32,
    /// `long`, `long long` (`i64`).
    I64,
    /// `ulong`, `unsigned long long` (`u64`).
    U64,
    /// `float` (`f32`).
    F32,
    /// `double` (`f64`).
    F64,
}

impl ScalarType {
    /// The OpenCL C name (`int`, `uint`, `long`, `ulong`, `float`, `double`).
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::I32 => "int",
            ScalarType::U32 => "uint",
            ScalarType::I64 => "long",
            ScalarType::U64 => "ulong",
            ScalarType::F32 => "float",
            ScalarType::F64 => "double",
        }
    }

    /// Bytes of a value.
    pub fn size(self) -> usize {
        match self {
            ScalarType::I32 | ScalarType::U32 | ScalarType::F32 => 4,
            _ => 8,
        }
    }

    /// The type of an OpenCL C or CUDA C type name (`float`, `unsigned int`, `uint32_t`, ...).
    #[cfg_attr(not(feature = "opencl"), allow(dead_code))]
    pub(crate) fn from_c_name(name: &str) -> Option<Self> {
        let words: Vec<&str> = name
            .split_whitespace()
            .filter(|w| !matches!(*w, "const" | "volatile" | "__private" | "private"))
            .collect();
        Some(match words.join(" ").as_str() {
            "int" | "signed int" | "signed" | "int32_t" => ScalarType::I32,
            "uint" | "unsigned int" | "unsigned" | "uint32_t" => ScalarType::U32,
            "long" | "long long" | "long int" | "long long int" | "int64_t" => ScalarType::I64,
            "ulong"
            | "unsigned long"
            | "unsigned long long"
            | "unsigned long int"
            | "unsigned long long int"
            | "uint64_t"
            | "size_t" => ScalarType::U64,
            "float" => ScalarType::F32,
            "double" => ScalarType::F64,
            _ => return None,
        })
    }
}

/// Bytes of a value of OpenCL C type `name` that the crate has no scalar for (`char`,
/// `half`, `float4`, `size_t`; `None` for a struct, a union or an unknown name), on a device
/// of `address_bits`-bit addresses.
#[cfg_attr(not(feature = "opencl"), allow(dead_code))]
pub(crate) fn opencl_type_size(name: &str, address_bits: u32) -> Option<usize> {
    let words: Vec<&str> = name
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__private" | "private"))
        .collect();
    let name = words.join(" ");
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let lanes = match &name[base.len()..] {
        "" => 1,
        // A 3-vector takes the room of a 4-vector.
        "3" => 4,
        n @ ("2" | "4" | "8" | "16") => n.parse().ok()?,
        _ => return None,
    };
    let size = match base {
        "char" | "uchar" | "signed char" | "unsigned char" => 1,
        "short" | "ushort" | "unsigned short" | "half" => 2,
        "int" | "uint" | "unsigned int" | "float" => 4,
        "long" | "ulong" | "unsigned long" | "double" => 8,
        "size_t" | "ptrdiff_t" | "intptr_t" | "uintptr_t" if lanes == 1 => {
            (address_bits / 8) as usize
        }
        _ => return None,
    };
    Some(size * lanes)
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scalar argument of a launch.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ScalarArg {
    /// `int`.
    I32(i32),
    /// `uint`.
    U32(u32),
    /// `long`.
    I64(i64),
    /// `ulong`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

impl ScalarArg {
    /// Its type.
    pub fn scalar_type(&self) -> ScalarType {
        match self {
            ScalarArg::I32(_) => ScalarType::I32,
            ScalarArg::U32(_) => ScalarType::U32,
            ScalarArg::I64(_) => ScalarType::I64,
            ScalarArg::U64(_) => ScalarType::U64,
            ScalarArg::F32(_) => ScalarType::F32,
            ScalarArg::F64(_) => ScalarType::F64,
        }
    }
}

/// A parameter of a compiled kernel, as the backend reports it: OpenCL's kernel argument
/// information (the program is built with `-cl-kernel-arg-info`), the parameter list of the
/// PTX that NVRTC wrote for CUDA. A host closure reports none.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelParam {
    /// A pointer to device memory (`__global`, `__constant`): pass a buffer. `read_only` when
    /// it is declared `const` or `__constant`.
    Buffer {
        /// Declared `const` or `__constant`.
        read_only: bool,
    },
    /// A scalar of this type.
    Scalar(ScalarType),
    /// A 32-bit integer (CUDA: the PTX does not tell `int` from `unsigned int`).
    Int32,
    /// A 64-bit word: a pointer (pass a buffer) or a 64-bit integer (CUDA: the PTX does not
    /// tell them apart).
    Word64,
    /// A `__local` pointer (OpenCL): launches cannot pass one (declare the array in the
    /// kernel's body instead).
    Local,
    /// A value of a type the crate has no scalar for (`char`, `half`, `float4`, a struct), of
    /// `size` bytes as the compiler's report tells it: it takes raw bytes of that size
    /// ([`crate::device::KernelArg::bytes`]) or a scalar of that size, nothing else.
    Bytes {
        /// The type as the compiler reports it (`char`, `float4`; CUDA's PTX tells only the
        /// size: `.b8[12]`).
        type_name: String,
        /// Bytes of a value.
        size: usize,
    },
    /// A parameter whose size the compiler's report does not tell, with its type as reported:
    /// launches cannot pass one (it would read past whatever they passed).
    Other(String),
}

/// An argument as [`KernelParam::accepts`] sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ArgShape {
    Buffer,
    Scalar(ScalarType),
    /// Raw bytes, so many.
    Bytes(usize),
}

/// `1 byte`, `12 bytes`.
fn bytes_text(n: usize) -> String {
    if n == 1 {
        "1 byte".to_string()
    } else {
        format!("{n} bytes")
    }
}

impl ArgShape {
    fn describe(self) -> String {
        match self {
            ArgShape::Buffer => "a buffer".to_string(),
            ArgShape::Scalar(t) => format!("a {t} scalar ({})", bytes_text(t.size())),
            ArgShape::Bytes(n) => format!("raw bytes ({})", bytes_text(n)),
        }
    }
}

impl KernelParam {
    /// `None` when `arg` fits the parameter, else why not.
    pub(crate) fn accepts(&self, arg: ArgShape) -> Option<String> {
        let ok = match (self, arg) {
            (KernelParam::Buffer { .. }, ArgShape::Buffer) => true,
            (KernelParam::Scalar(t), ArgShape::Scalar(a)) => *t == a,
            (KernelParam::Int32, ArgShape::Scalar(a)) => {
                matches!(a, ScalarType::I32 | ScalarType::U32)
            }
            (KernelParam::Word64, ArgShape::Buffer) => true,
            (KernelParam::Word64, ArgShape::Scalar(a)) => {
                matches!(a, ScalarType::I64 | ScalarType::U64)
            }
            (KernelParam::Bytes { size, .. }, ArgShape::Scalar(a)) => a.size() == *size,
            (KernelParam::Bytes { size, .. }, ArgShape::Bytes(n)) => n == *size,
            _ => false,
        };
        if ok {
            return None;
        }
        Some(format!(
            "the kernel takes {self}, the launch passes {}",
            arg.describe()
        ))
    }
}

impl fmt::Display for KernelParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelParam::Buffer { read_only: true } => f.write_str("a read-only buffer"),
            KernelParam::Buffer { read_only: false } => f.write_str("a buffer"),
            KernelParam::Scalar(t) => write!(f, "a {t} scalar"),
            KernelParam::Int32 => f.write_str("a 32-bit integer"),
            KernelParam::Word64 => f.write_str("a buffer or a 64-bit integer"),
            KernelParam::Local => f.write_str("a __local pointer (not supported by launches)"),
            KernelParam::Bytes { type_name, size } => {
                write!(f, "a {type_name} of {}", bytes_text(*size))
            }
            KernelParam::Other(t) => write!(
                f,
                "a {t}, whose size the compiler does not report (launch it natively)"
            ),
        }
    }
}

/// What a kernel is made from: a source per backend, and the host closure for `cpu`.
#[derive(Clone, Default)]
pub(crate) struct Sources {
    pub(crate) opencl: Option<Arc<str>>,
    /// Options of the OpenCL build (`-D N=4`, ...).
    pub(crate) opencl_options: Arc<str>,
    pub(crate) cuda: Option<Arc<str>>,
    pub(crate) host: Option<Arc<HostKernelFn>>,
}

/// Why kernel `name` cannot be handed to a compiler with `texts` (pairs of what each text is,
/// `"OpenCL C source"`, and the text), or `None`: the C APIs of the compilers take C strings,
/// which end at the first NUL byte, so a name or source holding one would panic in the
/// bindings or be cut short without a word.
pub(crate) fn nul_problem(name: &str, texts: &[(&str, &str)]) -> Option<String> {
    if let Some(at) = name.find('\0') {
        return Some(format!(
            "a NUL byte (at byte {at}) in the kernel's name: no compiler takes one"
        ));
    }
    texts.iter().find_map(|(what, text)| {
        text.find('\0')
            .map(|at| format!("a NUL byte (at byte {at}) in the {what}: no compiler takes one"))
    })
}

/// The parameter list of kernel `name` in C source: the text between the parentheses after
/// the first `name(` that follows `__kernel`, `kernel` or `__global__` (comments removed).
/// `None` when it is not found. Used only to name parameters in messages and to tell which
/// are `const`; the compiler's own information decides the checks.
pub(crate) fn declared_params(source: &str, name: &str) -> Option<Vec<String>> {
    let text = strip_comments(source);
    let mut from = 0;
    while let Some(at) = text[from..].find(name) {
        let start = from + at;
        from = start + name.len();
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = text[from..].trim_start();
        let Some(inner) = rest.strip_prefix('(') else {
            continue;
        };
        let head = &text[..start];
        let line_start = head.rfind([';', '}']).map_or(0, |i| i + 1);
        let decl = &head[line_start..];
        if !["__kernel", "kernel", "__global__"]
            .iter()
            .any(|k| decl.split_whitespace().any(|w| w == *k))
        {
            continue;
        }
        let end = inner.find(')')?;
        let list = inner[..end].trim();
        if list.is_empty() || list == "void" {
            return Some(Vec::new());
        }
        return Some(list.split(',').map(|p| p.trim().to_string()).collect());
    }
    None
}

fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |e| &rest[l + e..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_type_names_map_to_scalars() {
        assert_eq!(ScalarType::from_c_name("float"), Some(ScalarType::F32));
        assert_eq!(
            ScalarType::from_c_name("const unsigned int"),
            Some(ScalarType::U32)
        );
        assert_eq!(ScalarType::from_c_name("ulong"), Some(ScalarType::U64));
        assert_eq!(ScalarType::from_c_name("half"), None);
    }

    #[test]
    fn parameters_accept_their_kind_of_argument() {
        let buf = KernelParam::Buffer { read_only: true };
        assert!(buf.accepts(ArgShape::Buffer).is_none());
        let e = buf.accepts(ArgShape::Scalar(ScalarType::F32)).unwrap();
        assert!(
            e.contains("read-only buffer") && e.contains("float scalar"),
            "{e}"
        );
        let f = KernelParam::Scalar(ScalarType::F32);
        assert!(f.accepts(ArgShape::Scalar(ScalarType::F64)).is_some());
        assert!(f.accepts(ArgShape::Buffer).is_some());
        assert!(KernelParam::Int32
            .accepts(ArgShape::Scalar(ScalarType::I32))
            .is_none());
        assert!(KernelParam::Word64.accepts(ArgShape::Buffer).is_none());
        assert!(KernelParam::Word64
            .accepts(ArgShape::Scalar(ScalarType::F64))
            .is_some());
        assert!(KernelParam::Local.accepts(ArgShape::Buffer).is_some());
        // A type the crate has no scalar for takes exactly its size, as bytes or a scalar.
        let char4 = KernelParam::Bytes {
            type_name: "char4".into(),
            size: 4,
        };
        assert!(char4.accepts(ArgShape::Bytes(4)).is_none());
        assert!(char4.accepts(ArgShape::Scalar(ScalarType::U32)).is_none());
        let e = char4.accepts(ArgShape::Bytes(16)).unwrap();
        assert!(
            e.contains("char4 of 4 bytes") && e.contains("16 bytes"),
            "{e}"
        );
        assert!(char4.accepts(ArgShape::Scalar(ScalarType::F64)).is_some());
        assert!(char4.accepts(ArgShape::Buffer).is_some());
        // A size nobody reported: nothing fits.
        let unknown = KernelParam::Other("struct pair".into());
        for a in [
            ArgShape::Buffer,
            ArgShape::Bytes(8),
            ArgShape::Scalar(ScalarType::U64),
        ] {
            assert!(unknown.accepts(a).is_some());
        }
        assert!(KernelParam::Scalar(ScalarType::F32)
            .accepts(ArgShape::Bytes(4))
            .is_some());
    }

    #[test]
    fn opencl_types_have_their_sizes() {
        let size = |n: &str| opencl_type_size(n, 64);
        assert_eq!(size("char"), Some(1));
        assert_eq!(size("const uchar"), Some(1));
        assert_eq!(size("half"), Some(2));
        assert_eq!(size("float4"), Some(16));
        assert_eq!(size("int3"), Some(16));
        assert_eq!(size("double16"), Some(128));
        assert_eq!(opencl_type_size("size_t", 32), Some(4));
        assert_eq!(size("float5"), None);
        assert_eq!(size("struct pair"), None);
        assert_eq!(size("triple"), None);
    }

    #[test]
    fn nul_bytes_in_names_and_sources_are_found() {
        assert_eq!(
            nul_problem("scale", &[("OpenCL C source", "kernel void scale() {}")]),
            None
        );
        let e = nul_problem("sc\0ale", &[]).unwrap();
        assert!(e.contains("(at byte 2) in the kernel's name"), "{e}");
        let e = nul_problem("scale", &[("options", ""), ("CUDA C source", "a\0b")]).unwrap();
        assert!(e.contains("(at byte 1) in the CUDA C source"), "{e}");
    }

    #[test]
    fn declared_parameters_are_found_in_the_source() {
        let cl = "// sm_x(int a)\n/* kernel void f(int) */\n__kernel void scale(uint n,\n \
                  const __global float* x, __global float* y) { y[0] = x[0]; }";
        let p = declared_params(cl, "scale").unwrap();
        assert_eq!(
            p,
            ["uint n", "const __global float* x", "__global float* y"]
        );
        let cu = "extern \"C\" __global__ void leaky(const float* x, float* y, unsigned int n) {}";
        assert_eq!(declared_params(cu, "leaky").unwrap().len(), 3);
        assert!(declared_params(cu, "missing").is_none());
        assert_eq!(
            declared_params("kernel void nothing(void) {}", "nothing").unwrap(),
            Vec::<String>::new()
        );
    }
}
