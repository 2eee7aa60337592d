//! Classifies trait methods, arguments and return types for the forwarding table.
//!
//! Classes decide what a capture session records. Argument kinds tell the macro how to
//! read shapes from an argument and whether it must be relabelled between
//! `X<GraphCapture<B>>` and `X<B>` (Burn structs generic over the backend; the tensor
//! aliases need no relabel because `GraphCapture<B>` reuses `B`'s primitives).

use syn::visit::Visit;
use syn::visit_mut::VisitMut;
use syn::{GenericArgument, PathArguments, Type};

/// Aliases that resolve to the inner backend's associated types.
const ALIASES: [&str; 8] = [
    "FloatTensor",
    "IntTensor",
    "BoolTensor",
    "QuantizedTensor",
    "Device",
    "FloatElem",
    "IntElem",
    "BoolElem",
];

/// Tensor aliases whose shape and dtype a session records.
const TENSORS: [&str; 4] = ["FloatTensor", "IntTensor", "BoolTensor", "QuantizedTensor"];

/// Backend-generic structs that `backend/relabel.rs` converts.
const RELABELLED: [&str; 9] = [
    "TensorPrimitive",
    "QuantizationParametersPrimitive",
    "TransactionPrimitive",
    "MaxPool1dWithIndices",
    "MaxPool2dWithIndices",
    "MaxPool1dBackward",
    "MaxPool2dBackward",
    "DeformConv2dBackward",
    "InterpolateBackward",
];

/// What a session records for an op, derived from the method name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// An ordinary device op: recorded in the signature.
    Op,
    /// Reads device data back to the host (`*_into_data`, transactions).
    HostRead,
    /// Moves a tensor to another device.
    DeviceTransfer,
    /// Draws random numbers from host-seeded state.
    Rng,
    /// `float_random`: drawn from a trainer's device generator inside its steps (no
    /// breaker then), else host-seeded like the other random ops.
    DeviceRandom,
    /// Output shape depends on tensor values.
    DataDependentShape,
}

impl OpClass {
    /// The class as the table writes it. A device transfer names how to read the
    /// tensor's device and the two arguments, so that a same-device move (a no-op)
    /// is not recorded as a breaker.
    pub fn table_text(self, op: &str) -> String {
        match self {
            OpClass::DeviceTransfer => {
                let prefix = op.trim_end_matches("_to_device");
                format!("DeviceTransfer({prefix}_device, tensor, device)")
            }
            OpClass::DeviceRandom => "DeviceRandom(shape, device, dtype)".to_string(),
            other => other.as_str().to_string(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::Op => "Op",
            OpClass::HostRead => "HostRead",
            OpClass::DeviceTransfer => "DeviceTransfer",
            OpClass::Rng => "Rng",
            OpClass::DeviceRandom => "DeviceRandom",
            OpClass::DataDependentShape => "DataDependentShape",
        }
    }
}

pub fn classify_op(name: &str) -> OpClass {
    if name.ends_with("_into_data") || name == "tr_execute" {
        OpClass::HostRead
    } else if name.ends_with("_to_device") {
        OpClass::DeviceTransfer
    } else if name == "float_random" {
        OpClass::DeviceRandom
    } else if name.ends_with("_random") {
        OpClass::Rng
    } else if name.contains("argwhere") || name.contains("nonzero") {
        OpClass::DataDependentShape
    } else {
        OpClass::Op
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    Tensor,
    TensorRef,
    Tensors,
    OptTensor,
    Data,
    Relabel,
    Attr,
    /// A host attribute passed by reference (`&[usize]`, `&Device<B>`): an emulated
    /// graph keeps an owned copy and lends it back by reference.
    AttrRef,
    Unsupported,
}

impl ArgKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ArgKind::Tensor => "tensor",
            ArgKind::TensorRef => "tensor_ref",
            ArgKind::Tensors => "tensors",
            ArgKind::OptTensor => "opt_tensor",
            ArgKind::Data => "data",
            ArgKind::Relabel => "relabel",
            ArgKind::Attr => "attr",
            ArgKind::AttrRef => "attr_ref",
            ArgKind::Unsupported => "unsupported",
        }
    }
}

/// What a method returns, for recording the allocations it produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnKind {
    /// One tensor primitive.
    Tensor,
    /// A tuple of two tensor primitives.
    Pair,
    /// No tensor the step could read later (devices, flags, futures of host data).
    Plain,
    Relabel,
    Unsupported,
}

impl ReturnKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReturnKind::Tensor => "tensor",
            ReturnKind::Pair => "pair",
            ReturnKind::Plain => "plain",
            ReturnKind::Relabel => "relabel",
            ReturnKind::Unsupported => "unsupported",
        }
    }
}

/// Rewrites the trait's backend parameter `B` to `Self` and `crate::` to `burn_backend::`.
pub fn rewrite_type(ty: &Type) -> Type {
    struct Rewrite;
    impl VisitMut for Rewrite {
        fn visit_path_mut(&mut self, path: &mut syn::Path) {
            if path.leading_colon.is_none() && path.segments.len() == 1 {
                let segment = &mut path.segments[0];
                if segment.ident == "B" && segment.arguments.is_empty() {
                    segment.ident = syn::Ident::new("Self", segment.ident.span());
                }
            }
            if let Some(first) = path.segments.first_mut()
                && first.ident == "crate"
            {
                first.ident = syn::Ident::new("burn_backend", first.ident.span());
            }
            syn::visit_mut::visit_path_mut(self, path);
        }
    }
    let mut ty = ty.clone();
    Rewrite.visit_type_mut(&mut ty);
    ty
}

pub fn classify_arg(ty: &Type) -> ArgKind {
    if let Type::Reference(reference) = ty
        && outer_ident(&reference.elem).is_some_and(|i| TENSORS.contains(&i.as_str()))
    {
        return ArgKind::TensorRef;
    }
    match outer_ident(ty).as_deref() {
        Some(ident) if TENSORS.contains(&ident) => return ArgKind::Tensor,
        Some("Vec") if inner_is_tensor(ty) => return ArgKind::Tensors,
        Some("Option") if inner_is_tensor(ty) => return ArgKind::OptTensor,
        Some("TensorData") => return ArgKind::Data,
        Some(ident) if RELABELLED.contains(&ident) => return ArgKind::Relabel,
        _ => {}
    }
    if generic_over_self(ty) {
        ArgKind::Unsupported
    } else if matches!(ty, Type::Reference(_)) {
        ArgKind::AttrRef
    } else {
        ArgKind::Attr
    }
}

pub fn classify_return(ty: &Type) -> ReturnKind {
    if is_tensor(ty) {
        return ReturnKind::Tensor;
    }
    if let Type::Tuple(tuple) = ty
        && tuple.elems.len() == 2
        && tuple.elems.iter().all(is_tensor)
    {
        return ReturnKind::Pair;
    }
    if !generic_over_self(ty) {
        return ReturnKind::Plain;
    }
    match outer_ident(ty) {
        Some(ident) if RELABELLED.contains(&ident.as_str()) => ReturnKind::Relabel,
        _ => ReturnKind::Unsupported,
    }
}

fn is_tensor(ty: &Type) -> bool {
    outer_ident(ty).is_some_and(|i| TENSORS.contains(&i.as_str()))
}

fn outer_ident(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn inner_is_tensor(ty: &Type) -> bool {
    let Type::Path(path) = ty else { return false };
    let Some(segment) = path.path.segments.last() else {
        return false;
    };
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return false;
    };
    args.args.iter().any(|arg| match arg {
        GenericArgument::Type(inner) => {
            outer_ident(inner).is_some_and(|i| TENSORS.contains(&i.as_str()))
        }
        _ => false,
    })
}

/// True when `Self` appears as a generic argument of something other than an alias.
fn generic_over_self(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'a> Visit<'a> for Finder {
        fn visit_path_segment(&mut self, segment: &'a syn::PathSegment) {
            if let PathArguments::AngleBracketed(args) = &segment.arguments {
                let has_self = args.args.iter().any(|arg| {
                    matches!(arg, GenericArgument::Type(Type::Path(p)) if p.path.is_ident("Self"))
                });
                if has_self && !ALIASES.contains(&segment.ident.to_string().as_str()) {
                    self.0 = true;
                }
            }
            syn::visit::visit_path_segment(self, segment);
        }
    }
    let mut finder = Finder(false);
    finder.visit_type(ty);
    finder.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(text: &str) -> Type {
        rewrite_type(&syn::parse_str(text).unwrap())
    }

    #[test]
    fn op_classes_follow_names() {
        assert_eq!(classify_op("float_into_data"), OpClass::HostRead);
        assert_eq!(classify_op("tr_execute"), OpClass::HostRead);
        assert_eq!(classify_op("int_to_device"), OpClass::DeviceTransfer);
        assert_eq!(classify_op("float_random"), OpClass::DeviceRandom);
        assert_eq!(classify_op("int_random"), OpClass::Rng);
        assert_eq!(classify_op("bool_argwhere"), OpClass::DataDependentShape);
        assert_eq!(classify_op("float_add"), OpClass::Op);
    }

    #[test]
    fn arguments_are_classified() {
        assert_eq!(classify_arg(&ty("FloatTensor<B>")), ArgKind::Tensor);
        assert_eq!(classify_arg(&ty("&IntTensor<B>")), ArgKind::TensorRef);
        assert_eq!(classify_arg(&ty("Vec<BoolTensor<B>>")), ArgKind::Tensors);
        assert_eq!(
            classify_arg(&ty("Option<FloatTensor<B>>")),
            ArgKind::OptTensor
        );
        assert_eq!(classify_arg(&ty("TensorData")), ArgKind::Data);
        assert_eq!(classify_arg(&ty("TensorPrimitive<B>")), ArgKind::Relabel);
        assert_eq!(classify_arg(&ty("&Device<B>")), ArgKind::AttrRef);
        assert_eq!(classify_arg(&ty("&[usize]")), ArgKind::AttrRef);
        assert_eq!(classify_arg(&ty("Scalar")), ArgKind::Attr);
        assert_eq!(classify_arg(&ty("Unknown<B>")), ArgKind::Unsupported);
    }

    #[test]
    fn device_transfers_name_their_device_reader() {
        assert_eq!(
            OpClass::DeviceTransfer.table_text("q_to_device"),
            "DeviceTransfer(q_device, tensor, device)"
        );
        assert_eq!(OpClass::Rng.table_text("int_random"), "Rng");
        assert_eq!(
            OpClass::DeviceRandom.table_text("float_random"),
            "DeviceRandom(shape, device, dtype)"
        );
    }

    #[test]
    fn returns_are_classified() {
        assert_eq!(classify_return(&ty("FloatTensor<B>")), ReturnKind::Tensor);
        assert_eq!(
            classify_return(&ty("(FloatTensor<B>, IntTensor<B>)")),
            ReturnKind::Pair
        );
        assert_eq!(classify_return(&ty("bool")), ReturnKind::Plain);
        assert_eq!(classify_return(&ty("Device<B>")), ReturnKind::Plain);
        assert_eq!(
            classify_return(&ty("MaxPool2dWithIndices<B>")),
            ReturnKind::Relabel
        );
        assert_eq!(classify_return(&ty("Unknown<B>")), ReturnKind::Unsupported);
    }

    #[test]
    fn backend_parameter_and_crate_paths_are_rewritten() {
        let text = quote_type(&ty("crate::tensor::IndexingUpdateOp"));
        assert_eq!(text, "burn_backend::tensor::IndexingUpdateOp");
        assert_eq!(quote_type(&ty("FloatTensor<B>")), "FloatTensor<Self>");
    }

    fn quote_type(ty: &Type) -> String {
        crate::type_text(ty)
    }
}
