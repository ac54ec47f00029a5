//! Element types and reduction operations, with NCCL's numbering.

use std::fmt;

/// The element type of a buffer. Discriminants equal NCCL's `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    /// `i8`
    Int8 = 0,
    /// `u8`
    Uint8 = 1,
    /// `i32`
    Int32 = 2,
    /// `u32`
    Uint32 = 3,
    /// `i64`
    Int64 = 4,
    /// `u64`
    Uint64 = 5,
    /// IEEE half precision ([`half::f16`])
    Float16 = 6,
    /// `f32`
    Float32 = 7,
    /// `f64`
    Float64 = 8,
    /// bfloat16 ([`half::bf16`])
    Bfloat16 = 9,
    /// fp8 e4m3 (OCP "fn" variant: no infinities, max 448), reduced through f32
    Float8E4M3 = 10,
    /// fp8 e5m2 (IEEE-like, max 57344), reduced through f32
    Float8E5M2 = 11,
}

impl DataType {
    /// Every data type, in discriminant order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8E4M3,
        DataType::Float8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Short name as nccl-tests prints it (`int8`, `float`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8E4M3 => "f8e4m3",
            DataType::Float8E5M2 => "f8e5m2",
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8E4M3
                | DataType::Float8E5M2
        )
    }

    /// The type with NCCL discriminant `v`, if there is one.
    pub fn from_nccl(v: i64) -> Option<DataType> {
        DataType::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// Parses a name: nccl-tests names (`float`, `half`, ...), Rust names (`f32`, `i8`, ...)
    /// and NCCL's (`float32`, `int8`, `fp8_e4m3`, ...).
    pub fn parse(s: &str) -> Option<DataType> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::Int8,
            "uint8" | "u8" => DataType::Uint8,
            "int32" | "i32" | "int" => DataType::Int32,
            "uint32" | "u32" => DataType::Uint32,
            "int64" | "i64" => DataType::Int64,
            "uint64" | "u64" => DataType::Uint64,
            "half" | "f16" | "float16" | "fp16" => DataType::Float16,
            "float" | "f32" | "float32" | "fp32" => DataType::Float32,
            "double" | "f64" | "float64" | "fp64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "fp8_e4m3" | "e4m3" | "float8e4m3" => DataType::Float8E4M3,
            "f8e5m2" | "fp8_e5m2" | "e5m2" | "float8e5m2" => DataType::Float8E5M2,
            _ => return None,
        };
        Some(t)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataType::Int8 => "i8",
            DataType::Uint8 => "u8",
            DataType::Int32 => "i32",
            DataType::Uint32 => "u32",
            DataType::Int64 => "i64",
            DataType::Uint64 => "u64",
            DataType::Float16 => "f16",
            DataType::Float32 => "f32",
            DataType::Float64 => "f64",
            DataType::Bfloat16 => "bf16",
            DataType::Float8E4M3 => "fp8e4m3",
            DataType::Float8E5M2 => "fp8e5m2",
        })
    }
}

/// An element-wise binary reduction. Discriminants equal NCCL's `ncclRedOp_t` for these four.
///
/// `avg` and pre-multiplied sum are built from [`ElemOp::Sum`] plus a scaling pass
/// (see [`crate::scale`] and [`crate::divide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ElemOp {
    /// a + b (wrapping for integers)
    Sum = 0,
    /// a * b (wrapping for integers)
    Prod = 1,
    /// max(a, b) (NaN-propagating for floats)
    Max = 2,
    /// min(a, b) (NaN-propagating for floats)
    Min = 3,
}

impl ElemOp {
    /// Every element-wise op.
    pub const ALL: [ElemOp; 4] = [ElemOp::Sum, ElemOp::Prod, ElemOp::Max, ElemOp::Min];

    /// Name as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            ElemOp::Sum => "sum",
            ElemOp::Prod => "prod",
            ElemOp::Max => "max",
            ElemOp::Min => "min",
        }
    }
}
