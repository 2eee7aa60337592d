//! Capture sessions: what one training step did, recorded as it ran.
//!
//! A session is **thread-local**. Burn runs a step's ops on the calling thread: the
//! forward pass, autodiff's backward pass and the optimizer all call the backend from
//! the thread that called `step`, and burn-fusion only queues work from there. A
//! thread-local scope therefore sees exactly one step's ops, and two trainers on two
//! threads never see each other's records. A device-keyed scope would mix two trainers
//! that share a device.
//!
//! Sessions on one thread may nest or overlap in any order: every open session records
//! every op, and each is closed by its own handle. Outside a session, the decorator
//! pays one thread-local load per op: no allocation and no lock.
//!
//! Besides the signature, a session records which allocations the step read without
//! producing them itself ([`ExternalRead`]): every op's inputs and outputs are named by
//! their [`AllocationId`], and an input that no earlier op of the session produced is
//! read from outside the step. The step API checks each of those against what it knows
//! (parameters, optimizer state, the listed batch, constants).

use std::any::Any;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt::{self, Debug, Write as _};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;

use burn_backend::{DType, Scalar, Shape, TensorData, TensorMetadata};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::identity::{Allocated, AllocationId};

thread_local! {
    /// Number of open sessions on this thread; the only state the hot path reads.
    static OPEN: Cell<usize> = const { Cell::new(0) };
    /// The open sessions' recordings, keyed by session id.
    static RECORDINGS: RefCell<Vec<(u64, Recording)>> = const { RefCell::new(Vec::new()) };
    /// Source of session ids on this thread.
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
    /// Number of open sessions that keep the tensors they read from outside.
    static KEEPING: Cell<usize> = const { Cell::new(0) };
}

/// True when at least one session is open on this thread.
#[inline(always)]
pub(crate) fn is_recording() -> bool {
    OPEN.with(Cell::get) != 0
}

/// Records one op into every open session of this thread.
pub(crate) fn record_op(
    op: &'static str,
    breaker: Option<BreakerKind>,
    inputs: impl FnOnce(&mut OpRecorder),
) {
    let mut recorder = OpRecorder::default();
    inputs(&mut recorder);
    recorder.commit(op, breaker);
}

/// Why an op cannot be part of a replayed CUDA graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BreakerKind {
    /// Reads device data on the host (`*_into_data`, transactions, `sync`): a graph
    /// cannot hand values to the host in the middle of a replay.
    HostRead,
    /// Moves a tensor to another device (`*_to_device`).
    DeviceTransfer,
    /// Draws random numbers (`*_random`, dropout masks) or reseeds: host-side RNG state
    /// would be frozen into the graph and replay the same numbers.
    Rng,
    /// Produces a shape that depends on tensor values (`argwhere`, `nonzero`).
    DataDependentShape,
}

/// One capture breaker seen during a session: what kind, and which op.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureBreaker {
    /// The reason this op breaks a capture.
    pub kind: BreakerKind,
    /// The backend method that was called, e.g. `float_into_data`.
    pub op: Cow<'static, str>,
}

impl CaptureBreaker {
    pub(crate) fn new(kind: BreakerKind, op: &'static str) -> Self {
        Self {
            kind,
            op: Cow::Borrowed(op),
        }
    }
}

impl fmt::Display for CaptureBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} in `{}`", self.kind, self.op)
    }
}

/// Shape and dtype of one tensor input.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSig {
    /// The tensor's shape.
    pub shape: Shape,
    /// Its element type.
    pub dtype: DType,
}

/// One op as a session saw it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OpRecord {
    /// The backend method, e.g. `float_matmul`.
    pub op: &'static str,
    /// Shapes and dtypes of its tensor inputs, in argument order.
    pub inputs: Vec<TensorSig>,
    /// Hash of its other arguments: dims, options, host scalars, devices and the bytes
    /// of host data. Two steps that pass different host scalars differ here, so a
    /// value that varies between steps is never mistaken for a static one.
    pub attrs: u64,
}

/// The ordered ops of one step. Equal signatures mean the step is static.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct OpSignature {
    ops: Vec<OpRecord>,
}

impl OpSignature {
    /// The recorded ops, in call order.
    pub fn ops(&self) -> &[OpRecord] {
        &self.ops
    }

    /// Number of recorded ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when no op was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// A 64-bit digest, for cheap comparison and cache keys.
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// Index of the first op where the two signatures differ, if they do.
    pub fn first_difference(&self, other: &OpSignature) -> Option<usize> {
        let common = self.ops.len().min(other.ops.len());
        (0..common)
            .find(|&i| self.ops[i] != other.ops[i])
            .or((self.ops.len() != other.ops.len()).then_some(common))
    }
}

/// The first read, within one step, of an allocation the step did not produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalRead {
    /// The allocation read; `None` where its backend cannot name it.
    pub allocation: Option<AllocationId>,
    /// The backend method that read it, e.g. `float_embedding`.
    pub op: &'static str,
    /// Shape and dtype of the tensor read.
    pub tensor: TensorSig,
}

/// Everything one session recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recording {
    /// The op signature.
    pub signature: OpSignature,
    /// Capture breakers, in call order.
    pub breakers: Vec<CaptureBreaker>,
    /// Reads of allocations that no earlier op of the session produced, in call order,
    /// each allocation once.
    pub reads: Vec<ExternalRead>,
    /// Allocations the session's ops produced or already read.
    known: HashSet<AllocationId>,
    /// With [`CaptureSession::begin_keeping`]: a handle on each tensor read from outside
    /// whose allocation is not among those it was told to skip.
    kept: Kept,
}

/// Tensors a keeping session read from outside, by allocation (the inner backend's
/// primitives, type-erased: sessions are shared by every backend on the thread).
#[derive(Clone, Default)]
pub(crate) struct Kept {
    /// Allocations not to keep; `None`: the session keeps nothing.
    skip: Option<HashSet<AllocationId>>,
    tensors: Vec<(AllocationId, Arc<dyn Any + Send + Sync>)>,
}

impl Kept {
    /// The primitive kept for `allocation`, if one was, type-erased.
    pub(crate) fn get_any(&self, allocation: &AllocationId) -> Option<&(dyn Any + Send + Sync)> {
        self.tensors
            .iter()
            .find(|(id, _)| id == allocation)
            .map(|(_, tensor)| &**tensor)
    }
}

impl Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kept({})", self.tensors.len())
    }
}

/// What was kept is a side product, not part of what a step did.
impl PartialEq for Kept {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Kept {}

impl Recording {
    /// The tensors a keeping session read from outside.
    pub(crate) fn kept(&self) -> &Kept {
        &self.kept
    }

    fn add(&mut self, record: &OpRecord, breaker: Option<CaptureBreaker>, recorder: &OpRecorder) {
        if let Some(breaker) = breaker {
            self.breakers.push(breaker);
        }
        for (index, (allocation, tensor)) in recorder.reads.iter().enumerate() {
            let first = match allocation {
                Some(id) => self.known.insert(id.clone()),
                None => true,
            };
            if first
                && let (Some(id), Some(skip)) = (allocation, &self.kept.skip)
                && !skip.contains(id)
                && let Some(Some(primitive)) = recorder.primitives.get(index)
            {
                self.kept.tensors.push((id.clone(), Arc::clone(primitive)));
            }
            if first {
                self.reads.push(ExternalRead {
                    allocation: allocation.clone(),
                    op: record.op,
                    tensor: tensor.clone(),
                });
            }
        }
        self.known.extend(recorder.outputs.iter().cloned());
        self.signature.ops.push(record.clone());
    }
}

/// Whether an open keeping session would keep a read of `allocation`: one it did not
/// produce or read before, and was not told to skip.
pub(crate) fn wanted(allocation: &AllocationId) -> bool {
    KEEPING.with(Cell::get) != 0
        && RECORDINGS.with(|recordings| {
            recordings.borrow().iter().any(|(_, recording)| {
                recording.kept.skip.as_ref().is_some_and(|skip| {
                    !skip.contains(allocation) && !recording.known.contains(allocation)
                })
            })
        })
}

/// An op's tensors: few, so kept on the stack.
type PerTensor<T> = SmallVec<[T; 4]>;

/// Collects one op's inputs and outputs. Only used while a session is open.
#[derive(Clone, Default)]
pub(crate) struct OpRecorder {
    inputs: PerTensor<TensorSig>,
    attrs: DefaultHasher,
    /// The input tensors' allocations.
    reads: PerTensor<(Option<AllocationId>, TensorSig)>,
    /// The output tensors' allocations.
    outputs: PerTensor<AllocationId>,
    /// Handles on the input tensors, aligned with `reads`, while a keeping session is
    /// open.
    primitives: PerTensor<Option<Arc<dyn Any + Send + Sync>>>,
    /// Whether the inputs' allocations go unread ([`OpRecorder::unnamed`]).
    unnamed: bool,
}

impl OpRecorder {
    /// A recorder that does not read its inputs' allocations: for an op a trace names
    /// itself (`backend::trace`), where a matched op is never committed and an id costs
    /// the server's memory lock and a `Debug` format on the CUDA stacks.
    pub(crate) fn unnamed() -> Self {
        Self {
            unnamed: true,
            ..Self::default()
        }
    }

    pub(crate) fn tensor<T: TensorMetadata + Allocated + 'static>(&mut self, tensor: &T) {
        let sig = TensorSig {
            shape: tensor.shape(),
            dtype: tensor.dtype(),
        };
        let allocation = if self.unnamed {
            None
        } else {
            tensor.allocation_id()
        };
        // A handle more on a tensor can change the op's in-place decisions (CubeCL and
        // fusion write in place into tensors no one else holds): only the constants a
        // keeping session wants are cloned, which their owners hold anyway.
        let keep = allocation.as_ref().is_some_and(wanted);
        self.primitives
            .push(keep.then(|| Arc::new(tensor.clone()) as Arc<dyn Any + Send + Sync>));
        self.reads.push((allocation, sig.clone()));
        self.inputs.push(sig);
    }

    /// A tensor whose metadata only (device, flags) the op reads: in the signature, but
    /// not a read of its allocation.
    pub(crate) fn metadata<T: TensorMetadata>(&mut self, tensor: &T) {
        self.inputs.push(TensorSig {
            shape: tensor.shape(),
            dtype: tensor.dtype(),
        });
    }

    /// A tensor the op returned: later reads of it are reads of the step's own work.
    pub(crate) fn output<T: Allocated>(&mut self, tensor: &T) {
        self.outputs.extend(tensor.allocation_id());
    }

    /// An input, or an output when `output`.
    pub(crate) fn tensor_as<T: TensorMetadata + Allocated + 'static>(
        &mut self,
        tensor: &T,
        output: bool,
    ) {
        if output {
            self.output(tensor)
        } else {
            self.tensor(tensor)
        }
    }

    /// An optional input, or output when `output`.
    pub(crate) fn optional_as<T: TensorMetadata + Allocated + 'static>(
        &mut self,
        tensor: &Option<T>,
        output: bool,
    ) {
        match tensor {
            Some(tensor) => self.tensor_as(tensor, output),
            None if output => {}
            None => self.attrs.write_u8(0),
        }
    }

    pub(crate) fn optional<T: TensorMetadata + Allocated + 'static>(&mut self, tensor: &Option<T>) {
        self.optional_as(tensor, false)
    }

    pub(crate) fn data(&mut self, data: &TensorData) {
        self.inputs.push(TensorSig {
            shape: data.shape.clone(),
            dtype: data.dtype,
        });
        data.as_bytes().hash(&mut self.attrs);
    }

    /// Hashes an owned argument: the common kinds (host scalars, sizes, shapes) by
    /// their values, which a trace does at every op, any other through its `Debug` form
    /// (formatting a float is a tenth of a microsecond). Two values hash alike only where
    /// they are equal, bit for bit: `-0.0` and `0.0` differ, as NaNs of other payloads do.
    pub(crate) fn attr_value<T: Debug + 'static>(&mut self, value: &T) {
        let any: &dyn Any = value;
        if let Some(scalar) = any.downcast_ref::<Scalar>() {
            let (kind, bits) = match *scalar {
                Scalar::Float(value) => (0u8, value.to_bits()),
                Scalar::Int(value) => (1, value as u64),
                Scalar::UInt(value) => (2, value),
                Scalar::Bool(value) => (3, u64::from(value)),
            };
            self.attrs.write_u8(kind);
            self.attrs.write_u64(bits);
        } else if let Some(size) = any.downcast_ref::<usize>() {
            self.attrs.write_usize(*size);
        } else if let Some(shape) = any.downcast_ref::<Shape>() {
            shape.hash(&mut self.attrs);
        } else {
            return self.attr(value);
        }
        self.attrs.write_u8(0xfe);
    }

    /// Hashes any argument through its `Debug` form, without allocating.
    pub(crate) fn attr<T: Debug + ?Sized>(&mut self, value: &T) {
        // Writing into a hasher cannot fail.
        let _ = write!(HashWriter(&mut self.attrs), "{value:?}");
        self.attrs.write_u8(0xff);
    }

    /// The shapes and dtypes of the op's tensor inputs so far, in argument order.
    pub(crate) fn inputs(&self) -> &[TensorSig] {
        &self.inputs
    }

    /// The hash of the op's other arguments so far (`OpRecord::attrs`).
    pub(crate) fn attrs(&self) -> u64 {
        self.attrs.clone().finish()
    }

    /// The op as a session records it: a trace compares it with the graph's.
    pub(crate) fn op_record(&self, op: &'static str) -> OpRecord {
        OpRecord {
            op,
            inputs: self.inputs.to_vec(),
            attrs: self.attrs.clone().finish(),
        }
    }

    /// Records the op into every open session of this thread.
    pub(crate) fn commit(self, op: &'static str, breaker: Option<BreakerKind>) {
        RECORDINGS.with(|recordings| {
            let mut recordings = recordings.borrow_mut();
            if recordings.is_empty() {
                return;
            }
            let record = OpRecord {
                op,
                inputs: self.inputs.to_vec(),
                attrs: self.attrs.finish(),
            };
            let breaker = breaker.map(|kind| CaptureBreaker::new(kind, op));
            for (_, recording) in recordings.iter_mut() {
                recording.add(&record, breaker.clone(), &self);
            }
        });
    }
}

/// Feeds formatted text into a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// An open capture session on the current thread.
///
/// Opened by the step API around one training step. Dropping it without
/// [`finish`](Self::finish) discards its recording, so a panicking step leaves no
/// session open. It is `!Send`: it belongs to the thread whose ops it records.
#[must_use = "a session records until it is finished or dropped"]
pub struct CaptureSession {
    /// The id of the session's recording; `None` for a session that records nothing.
    id: Option<u64>,
    keeping: bool,
    _thread_bound: PhantomData<*const ()>,
}

impl CaptureSession {
    /// Opens a session on this thread.
    pub fn begin() -> Self {
        Self::open(Recording::default(), false)
    }

    /// Opens a session that also keeps a handle on each tensor it reads from outside,
    /// except those whose allocation is in `skip` (the trainer's own, the batch's): the
    /// constants a capture reads, whose holders its replays check
    /// ([`GraphBackend::holder`](super::GraphBackend::holder)). Only the tensors the
    /// step closure reads from its surroundings are kept: they are held there anyway,
    /// so a handle more changes no in-place decision of the step.
    pub(crate) fn begin_keeping(skip: HashSet<AllocationId>) -> Self {
        KEEPING.with(|keeping| keeping.set(keeping.get() + 1));
        let recording = Recording {
            kept: Kept {
                skip: Some(skip),
                tensors: Vec::new(),
            },
            ..Recording::default()
        };
        Self::open(recording, true)
    }

    /// Opens a session that records nothing: ops on this thread build their records,
    /// as they do while any session is open, but commit them only into other open
    /// sessions. A trace that does not observe needs the records (it matches each op
    /// against its graph's) but never reads a recording of its own; committing every
    /// unmatched op (each `float_device` read) into one cost it time at every op.
    pub(crate) fn begin_unrecorded() -> Self {
        OPEN.with(|open| open.set(open.get() + 1));
        Self {
            id: None,
            keeping: false,
            _thread_bound: PhantomData,
        }
    }

    fn open(recording: Recording, keeping: bool) -> Self {
        let id = NEXT_ID.with(|next| {
            let id = next.get();
            next.set(id + 1);
            id
        });
        RECORDINGS.with(|r| r.borrow_mut().push((id, recording)));
        OPEN.with(|open| open.set(open.get() + 1));
        Self {
            id: Some(id),
            keeping,
            _thread_bound: PhantomData,
        }
    }

    /// Runs `f` inside a new session and returns its result with the recording.
    pub fn record<R>(f: impl FnOnce() -> R) -> (R, Recording) {
        let session = Self::begin();
        let result = f();
        (result, session.finish())
    }

    /// Closes the session and returns what it recorded.
    pub fn finish(self) -> Recording {
        let recording = self.take();
        std::mem::forget(self);
        recording
    }

    fn take(&self) -> Recording {
        OPEN.with(|open| open.set(open.get() - 1));
        if self.keeping {
            KEEPING.with(|keeping| keeping.set(keeping.get() - 1));
        }
        let Some(own) = self.id else {
            return Recording::default();
        };
        RECORDINGS.with(|recordings| {
            let mut recordings = recordings.borrow_mut();
            let index = recordings
                .iter()
                .position(|(id, _)| *id == own)
                .expect("an open session that records has a recording");
            recordings.swap_remove(index).1
        })
    }
}

impl Drop for CaptureSession {
    fn drop(&mut self) {
        self.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_dummy(op: &'static str, breaker: Option<BreakerKind>) {
        if is_recording() {
            record_op(op, breaker, |rec| rec.attr(&1usize));
        }
    }

    #[test]
    fn nothing_is_recorded_outside_a_session() {
        assert!(!is_recording());
        record_dummy("outside", None);
        let (_, recording) = CaptureSession::record(|| record_dummy("inside", None));
        assert_eq!(recording.signature.len(), 1);
        assert_eq!(recording.signature.ops()[0].op, "inside");
        assert!(!is_recording());
    }

    #[test]
    fn dropped_session_closes() {
        let session = CaptureSession::begin();
        assert!(is_recording());
        drop(session);
        assert!(!is_recording());
    }

    #[test]
    fn an_unrecorded_session_lets_ops_record_but_keeps_nothing_of_them() {
        let unrecorded = CaptureSession::begin_unrecorded();
        assert!(is_recording());
        let (_, outer) = CaptureSession::record(|| record_dummy("both", None));
        record_dummy("alone", None);
        assert_eq!(outer.signature.len(), 1);
        assert!(unrecorded.finish().signature.is_empty());
        assert!(!is_recording());
        assert!(RECORDINGS.with(|recordings| recordings.borrow().is_empty()));
    }

    #[test]
    fn first_difference_finds_extra_and_changed_ops() {
        let (_, a) = CaptureSession::record(|| record_dummy("a", None));
        let (_, ab) = CaptureSession::record(|| {
            record_dummy("a", None);
            record_dummy("b", None);
        });
        let (_, c) = CaptureSession::record(|| record_dummy("c", None));
        assert_eq!(a.signature.first_difference(&a.signature), None);
        assert_eq!(a.signature.first_difference(&ab.signature), Some(1));
        assert_eq!(a.signature.first_difference(&c.signature), Some(0));
        assert_ne!(a.signature.fingerprint(), c.signature.fingerprint());
    }

    #[test]
    fn a_keeping_session_keeps_what_it_read_from_outside_except_what_it_skips() {
        use crate::backend::identity::Allocated;

        #[derive(Clone, Debug)]
        struct Fake(u64);
        impl Allocated for Fake {
            fn allocation_id(&self) -> Option<AllocationId> {
                Some(AllocationId::unique(self.0))
            }
        }
        impl TensorMetadata for Fake {
            fn dtype(&self) -> DType {
                DType::F32
            }
            fn shape(&self) -> Shape {
                Shape::new([1])
            }
            fn rank(&self) -> usize {
                1
            }
        }
        let skip = HashSet::from([AllocationId::unique(1)]);
        let session = CaptureSession::begin_keeping(skip);
        let plain = CaptureSession::begin();
        record_op("a", None, |r| {
            r.tensor(&Fake(1));
            r.tensor(&Fake(2));
            let cloned: Vec<bool> = r.primitives.iter().map(Option::is_some).collect();
            assert_eq!(
                cloned,
                [false, true],
                "only what the session keeps is cloned"
            );
        });
        // Read again, or produced by the session: never cloned.
        record_op("b", None, |r| {
            r.tensor(&Fake(2));
            assert!(r.primitives.iter().all(Option::is_none), "known by now");
            r.output(&Fake(3));
        });
        record_op("c", None, |r| {
            r.tensor(&Fake(3));
            assert!(
                r.primitives.iter().all(Option::is_none),
                "produced in the session"
            );
        });
        let recording = session.finish();
        let other = plain.finish();
        assert!(recording.kept().get_any(&AllocationId::unique(1)).is_none());
        assert_eq!(
            recording
                .kept()
                .get_any(&AllocationId::unique(2))
                .and_then(|kept| kept.downcast_ref::<Fake>())
                .unwrap()
                .0,
            2
        );
        assert!(other.kept().get_any(&AllocationId::unique(2)).is_none());
        assert!(!is_recording(), "both sessions closed");
        assert_eq!(KEEPING.with(Cell::get), 0);
    }

    #[test]
    fn attrs_distinguish_host_values() {
        let (_, one) = CaptureSession::record(|| record_op("x", None, |r| r.attr(&1.0f64)));
        let (_, two) = CaptureSession::record(|| record_op("x", None, |r| r.attr(&2.0f64)));
        assert_ne!(one.signature, two.signature);
    }
}
