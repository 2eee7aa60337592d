//! The recording an emulated capture makes of its step, and its replay.
//!
//! While a program records on this thread, every op the decorator forwards adds a step:
//! the slots it reads, the op with its host attributes (owned copies), and the slots it
//! writes. A slot names one value of the step: a tensor's allocation and view, and how
//! many times an op has produced that key before (an op that works in place produces
//! its input's key again). A read of a slot no op produced is a read from outside the
//! step (parameters, optimizer state, the batch, constants): the program keeps a handle
//! on that tensor, as a device graph keeps the address it read.
//!
//! A replay runs the steps in order on those handles and never calls the step closure:
//! a pinned buffer is read as it is now, anything else as it was at capture, stale
//! values included. A value is handed to its last reader by move, so that the op works
//! in place at replay exactly where it did at capture.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, OnceLock};

use burn_backend::TensorMetadata;

use crate::backend::identity::{Allocated, AllocationId};
use crate::backend::session::OpRecord;
use crate::backend::stand_in::{LaterStandIn, StandIn};

/// A value of the step, type-erased: the inner backend's primitives.
pub(crate) type Value = Arc<dyn Any + Send + Sync>;

/// A tensor the step read from outside. A device graph keeps only the addresses it
/// reads, never a reference that keeps them allocated: a Flex tensor's bytes are kept
/// the same way, weakly, so that a tensor freed after the capture is gone for the
/// replay too (its holders tell the trainer, as they do on a device).
enum Outside {
    Held(Value),
    /// Kept by the device graph's own addresses: a trace that stops matching hands the
    /// value it saw (`Inner::fill_until`).
    Unheld,
    #[cfg(feature = "flex")]
    Flex {
        data: std::sync::Weak<burn_flex_bytes::Bytes>,
        layout: burn_flex::Layout,
        dtype: burn_backend::DType,
    },
}

#[cfg(feature = "flex")]
mod burn_flex_bytes {
    pub(super) use cubecl_common::bytes::Bytes;
}

impl Outside {
    fn of<T: Clone + Send + Sync + 'static>(tensor: &T) -> Self {
        #[cfg(feature = "flex")]
        if let Some(tensor) = (tensor as &dyn Any).downcast_ref::<burn_flex::FlexTensor>() {
            return Outside::Flex {
                data: Arc::downgrade(&tensor.data_arc()),
                layout: tensor.layout().clone(),
                dtype: tensor.dtype(),
            };
        }
        Outside::Held(Arc::new(tensor.clone()))
    }

    /// The tensor, unless it was freed.
    fn value(&self) -> Option<Value> {
        match self {
            Outside::Held(value) => Some(Arc::clone(value)),
            Outside::Unheld => None,
            #[cfg(feature = "flex")]
            Outside::Flex {
                data,
                layout,
                dtype,
            } => {
                let tensor =
                    burn_flex::FlexTensor::from_arc(data.upgrade()?, layout.clone(), *dtype);
                Some(Arc::new(tensor))
            }
        }
    }
}

/// What one recorded op does at replay.
pub(crate) type Thunk = Box<dyn Fn(&mut Env<'_>) -> Result<(), Missing> + Send + Sync>;

/// One value of a recorded step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Slot {
    allocation: AllocationId,
    /// Shape, dtype and where in the allocation the values lie.
    view: u64,
    /// How many ops had produced this allocation and view before.
    generation: u32,
}

/// A replay met a slot it cannot serve: a recording the emulation got wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the emulated replay of `{op}` found no {what} for one of its inputs")]
pub(crate) struct Missing {
    pub(crate) op: &'static str,
    pub(crate) what: &'static str,
}

/// An op an emulated graph cannot replay: its capture is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NotEmulated {
    pub(crate) op: &'static str,
}

struct Step {
    op: &'static str,
    run: Thunk,
    /// What a trace of a later step must match, for a step the closure's ops made.
    traced: Option<Traced>,
}

/// One op of the step as a trace sees it: its record, the slots it read and wrote, and
/// the stand-ins a matched op hands back in place of its outputs.
pub(crate) struct Traced {
    pub(crate) record: OpRecord,
    pub(crate) inputs: Vec<Option<Slot>>,
    pub(crate) outputs: Vec<Option<Slot>>,
    pub(crate) stand_ins: Vec<StandInValue>,
}

/// A tensor a trace may keep as a value of the step: any primitive, type-erased.
pub(crate) trait AsValue {
    /// A handle on the same tensor.
    fn as_value(&self) -> Value;
}

impl<T: Clone + Send + Sync + 'static> AsValue for T {
    fn as_value(&self) -> Value {
        Arc::new(self.clone())
    }
}

/// A stand-in, and its own key.
type Made = (Value, Option<Key>);

/// A stand-in for one output, and how to fill it with a value of its type. Made while
/// the capture records, or, where the backend makes them later
/// (`StandIn::stand_in_later`), once the capture's window has closed
/// ([`Inner::make_stand_ins`]; at its first use otherwise).
pub(crate) struct StandInValue {
    /// The stand-in, and its own key, by which a trace knows it when an op reads it.
    made: OnceLock<Made>,
    make: Option<LaterStandIn<Made>>,
    fill: fn(&Value, &Value) -> bool,
}

impl StandInValue {
    /// A stand-in for `output`, where its type has them.
    pub(crate) fn of<T>(output: &T) -> Option<Self>
    where
        T: StandIn + TensorMetadata + Allocated + Send + Sync + 'static,
    {
        fn fill<T: StandIn + 'static>(stand_in: &Value, value: &Value) -> bool {
            match (stand_in.downcast_ref::<T>(), value.downcast_ref::<T>()) {
                (Some(stand_in), Some(value)) => stand_in.fill(value),
                _ => false,
            }
        }
        fn made<T: TensorMetadata + Allocated + Send + Sync + 'static>(stand_in: T) -> Made {
            let key = key_of(&stand_in);
            (Arc::new(stand_in), key)
        }
        let fill = fill::<T>;
        if let Some(stand_in) = output.stand_in() {
            return Some(Self {
                made: OnceLock::from(made(stand_in)),
                make: None,
                fill,
            });
        }
        let later = output.stand_in_later()?;
        Some(Self {
            made: OnceLock::new(),
            make: Some(Box::new(move || made(later()))),
            fill,
        })
    }

    fn made(&self) -> &Made {
        self.made.get_or_init(|| {
            let make = self
                .make
                .as_ref()
                .expect("a stand-in not made has its maker");
            make()
        })
    }

    /// The stand-in.
    pub(crate) fn value(&self) -> &Value {
        &self.made().0
    }

    /// The stand-in's own key.
    pub(crate) fn key(&self) -> Option<&Key> {
        self.made().1.as_ref()
    }

    /// Writes `value` into the stand-in; false where it cannot.
    fn fill(&self, value: &Value) -> bool {
        (self.fill)(self.value(), value)
    }
}

/// A program being recorded on this thread.
struct Recorder {
    /// The generation each key is at: produced keys only.
    generations: HashMap<(AllocationId, u64), u32>,
    /// Tensors read from outside the step, by slot.
    outside: HashMap<Slot, Outside>,
    steps: Vec<Step>,
    /// Reads of each slot, counted as the steps are recorded.
    reads: HashMap<Slot, usize>,
    /// The first op that could not be recorded.
    refused: Option<NotEmulated>,
    /// Slots the op being recorded read and wrote, taken by its step.
    pending: (Vec<Option<Slot>>, Vec<Option<Slot>>),
    /// Whether every traced step has its stand-ins.
    traceable: bool,
    /// Whether reads from outside are kept ([`Recording::begin`]) or only named
    /// ([`Recording::begin_unheld`]).
    hold_outside: bool,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// True while a program records on this thread.
pub(crate) fn recording() -> bool {
    RECORDER.with(|r| r.borrow().is_some())
}

fn with<R>(f: impl FnOnce(&mut Recorder) -> R) -> Option<R> {
    RECORDER.with(|r| r.borrow_mut().as_mut().map(f))
}

fn view_of<T: TensorMetadata + Allocated>(tensor: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    tensor.shape().hash(&mut hasher);
    tensor.dtype().hash(&mut hasher);
    tensor.hash_view(&mut hasher);
    hasher.finish()
}

/// What tells a tensor's values apart: its allocation and view.
pub(crate) type Key = (AllocationId, u64);

/// The key of `tensor`, where it names its allocation.
pub(crate) fn key_of<T: TensorMetadata + Allocated>(tensor: &T) -> Option<Key> {
    Some((tensor.allocation_id()?, view_of(tensor)))
}

impl Slot {
    /// The slot of `key` after `generation` ops produced it (0: read from outside).
    pub(crate) fn new(key: Key, generation: u32) -> Self {
        Self {
            allocation: key.0,
            view: key.1,
            generation,
        }
    }

    /// The allocation and view.
    pub(crate) fn key(&self) -> Key {
        (self.allocation.clone(), self.view)
    }

    /// Whether it is `key` at `generation`, without cloning the key.
    pub(crate) fn is(&self, key: &Key, generation: u32) -> bool {
        self.generation == generation && self.view == key.1 && self.allocation == key.0
    }

    /// How many ops had produced its key.
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }
}

/// The slot a tensor the op reads is in now; a tensor no op of the step produced is
/// kept as read from outside.
pub(crate) fn input<T>(op: &'static str, tensor: &T) -> Option<Slot>
where
    T: TensorMetadata + Allocated + Clone + Send + Sync + 'static,
{
    let Some(allocation) = tensor.allocation_id() else {
        refuse(op);
        return None;
    };
    with(|recorder| {
        let key = (allocation, view_of(tensor));
        let generation = recorder.generations.get(&key).copied().unwrap_or(0);
        let slot = Slot {
            allocation: key.0,
            view: key.1,
            generation,
        };
        if generation == 0 {
            let hold = recorder.hold_outside;
            recorder.outside.entry(slot.clone()).or_insert_with(|| {
                if hold {
                    Outside::of(tensor)
                } else {
                    Outside::Unheld
                }
            });
        }
        *recorder.reads.entry(slot.clone()).or_default() += 1;
        recorder.pending.0.push(Some(slot.clone()));
        slot
    })
}

/// The slot an op's output goes into.
pub(crate) fn output<T: TensorMetadata + Allocated>(op: &'static str, tensor: &T) -> Option<Slot> {
    let Some(allocation) = tensor.allocation_id() else {
        refuse(op);
        return None;
    };
    with(|recorder| {
        let key = (allocation, view_of(tensor));
        let generation = recorder.generations.entry(key.clone()).or_default();
        *generation += 1;
        let slot = Slot {
            allocation: key.0,
            view: key.1,
            generation: *generation,
        };
        recorder.pending.1.push(Some(slot.clone()));
        slot
    })
}

/// Whether an op of the step produced the value in `slot` (else it was read from
/// outside the step).
pub(crate) fn produced(slot: &Option<Slot>) -> bool {
    slot.as_ref().is_some_and(|slot| slot.generation > 0)
}

/// Adds a step that no trace matches (a write into a pin, the generator's advance).
pub(crate) fn push(op: &'static str, run: Thunk) {
    with(|recorder| {
        recorder.pending = Default::default();
        recorder.steps.push(Step {
            op,
            run,
            traced: None,
        })
    });
}

/// Adds the step of an op the step closure's work made, which later steps' traces
/// match: `record` as the session recorded it, the slots it read (`visible`: those of
/// its tensor arguments; a served draw's generator state is not one) and wrote since the
/// last step, and a stand-in for each output (`None` where the type has none: the
/// program then cannot be traced).
pub(crate) fn push_traced(
    op: &'static str,
    run: Thunk,
    record: OpRecord,
    visible: bool,
    stand_ins: Option<Vec<StandInValue>>,
) {
    with(|recorder| {
        let (inputs, outputs) = std::mem::take(&mut recorder.pending);
        let traced = stand_ins.map(|stand_ins| Traced {
            record,
            inputs: if visible { inputs } else { Vec::new() },
            outputs,
            stand_ins,
        });
        recorder.traceable &= traced.is_some();
        recorder.steps.push(Step { op, run, traced });
    });
}

/// What a step keeps of an argument it does not replay.
pub(crate) struct Unkept;

/// Marks the program as one that cannot be replayed, for `op`.
pub(crate) fn refuse(op: &'static str) {
    with(|recorder| {
        recorder.refused.get_or_insert(NotEmulated { op });
    });
}

/// A program recording on this thread until it is finished or dropped.
pub(crate) struct Recording {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl Recording {
    /// Starts recording a program to replay; `None` if a program already records on
    /// this thread.
    pub(crate) fn begin() -> Option<Self> {
        Self::begin_holding(true)
    }

    /// Starts recording what traces of a device graph match: reads from outside the
    /// step are named, never held (a handle more would change the captured ops'
    /// in-place decisions and the liveness of constants); a trace that stops matching
    /// hands them over. Such a program is never run as a whole.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn begin_unheld() -> Option<Self> {
        Self::begin_holding(false)
    }

    fn begin_holding(hold_outside: bool) -> Option<Self> {
        RECORDER.with(|r| {
            let mut r = r.borrow_mut();
            if r.is_some() {
                return None;
            }
            *r = Some(Recorder {
                generations: HashMap::new(),
                outside: HashMap::new(),
                steps: Vec::new(),
                reads: HashMap::new(),
                refused: None,
                pending: Default::default(),
                traceable: true,
                hold_outside,
            });
            Some(Self {
                _thread_bound: std::marker::PhantomData,
            })
        })
    }

    /// Stops recording: the program, or the first op it could not record.
    pub(crate) fn finish(self) -> Result<Program, NotEmulated> {
        let recorder = RECORDER
            .with(|r| r.borrow_mut().take())
            .expect("a recording owns its recorder");
        std::mem::forget(self);
        if let Some(refused) = recorder.refused {
            return Err(refused);
        }
        Ok(Program(Arc::new(Inner {
            outside: recorder.outside,
            steps: recorder.steps,
            reads: recorder.reads,
            traceable: recorder.traceable,
        })))
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        RECORDER.with(|r| r.borrow_mut().take());
    }
}

/// A recorded step, replayable: what an emulated graph is.
pub struct Program(Arc<Inner>);

/// A program's recording, shared with the traces that match it.
pub(crate) struct Inner {
    outside: HashMap<Slot, Outside>,
    steps: Vec<Step>,
    reads: HashMap<Slot, usize>,
    traceable: bool,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("steps", &self.0.steps.len())
            .field("outside", &self.0.outside.len())
            .finish()
    }
}

impl Program {
    /// Runs every step in order.
    pub(crate) fn run(&self) -> Result<(), Missing> {
        self.0
            .run_until(self.0.steps.len(), HashMap::new(), |_, _| {})
    }

    /// The recording, for a trace to match, if every op of it has stand-ins.
    pub(crate) fn traceable(&self) -> Option<Arc<Inner>> {
        self.0.traceable.then(|| Arc::clone(&self.0))
    }

    /// The names of the recorded ops, in order.
    #[cfg(test)]
    pub(crate) fn ops(&self) -> Vec<&'static str> {
        self.0.steps.iter().map(|step| step.op).collect()
    }
}

impl Inner {
    /// Runs steps `..end`, reading from outside what `supplied` holds, else what the
    /// recording kept; `after` sees each traced step and the values it bound.
    fn run_until(
        &self,
        end: usize,
        supplied: HashMap<Slot, Value>,
        mut after: impl FnMut(&Traced, &Env<'_>),
    ) -> Result<(), Missing> {
        let mut env = Env {
            values: HashMap::new(),
            supplied,
            outside: &self.outside,
            left: self.reads.clone(),
            op: "",
        };
        for step in &self.steps[..end] {
            env.op = step.op;
            (step.run)(&mut env)?;
            if let Some(traced) = &step.traced {
                after(traced, &env);
            }
        }
        Ok(())
    }

    /// The steps, each with its trace record where it has one.
    pub(crate) fn traced(&self, step: usize) -> Option<Option<&Traced>> {
        self.steps.get(step).map(|step| step.traced.as_ref())
    }

    /// Makes every stand-in not made yet (`StandIn::stand_in_later`): called once the
    /// capture's window has closed, so that traces hand out stand-ins made outside it.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn make_stand_ins(&self) {
        let traced = self.steps.iter().filter_map(|step| step.traced.as_ref());
        for stand_in in traced.flat_map(|traced| &traced.stand_ins) {
            stand_in.made();
        }
    }

    /// The number of traced steps.
    pub(crate) fn traced_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|step| step.traced.is_some())
            .count()
    }

    /// Whether `slot` is a value read from outside the step.
    pub(crate) fn reads_outside(&self, slot: &Slot) -> bool {
        self.outside.contains_key(slot)
    }

    /// Runs steps `..end` on the values as they are now (`supplied`: the tensors from
    /// outside the step that the trace saw read) and fills the stand-ins of the traced
    /// ones with what they compute: a trace that stopped matching at step `end` hands
    /// the closure real values from there on.
    pub(crate) fn fill_until(
        &self,
        end: usize,
        supplied: HashMap<Slot, Value>,
    ) -> Result<(), Missing> {
        let mut unfilled = None;
        self.run_until(end, supplied, |traced, env| {
            for (slot, stand_in) in traced.outputs.iter().zip(&traced.stand_ins) {
                let filled = slot
                    .as_ref()
                    .and_then(|slot| env.values.get(slot))
                    .is_some_and(|value| stand_in.fill(value));
                if !filled {
                    unfilled.get_or_insert(traced.record.op);
                }
            }
        })?;
        match unfilled {
            Some(op) => Err(Missing {
                op,
                what: "stand-in to fill",
            }),
            None => Ok(()),
        }
    }
}

/// The values of one replay.
pub(crate) struct Env<'p> {
    values: HashMap<Slot, Value>,
    /// Values from outside handed over by a trace, read before the recording's own.
    supplied: HashMap<Slot, Value>,
    outside: &'p HashMap<Slot, Outside>,
    /// Reads of each slot still to come.
    left: HashMap<Slot, usize>,
    op: &'static str,
}

impl Env<'_> {
    /// The value of `slot`, moved out at its last read.
    pub(crate) fn take<T: Clone + Send + Sync + 'static>(
        &mut self,
        slot: &Option<Slot>,
    ) -> Result<T, Missing> {
        let missing = |what| Missing { op: self.op, what };
        let slot = slot.as_ref().ok_or(missing("slot"))?;
        let left = self.left.get_mut(slot).ok_or(missing("read count"))?;
        *left = left.saturating_sub(1);
        let last = *left == 0;
        let value = match self.values.get(slot) {
            Some(_) if last => self.values.remove(slot).expect("present"),
            Some(value) => Arc::clone(value),
            None if let Some(value) = self.supplied.get(slot) => Arc::clone(value),
            None => match self.outside.get(slot).ok_or(missing("value"))? {
                Outside::Unheld => return Err(missing("value handed over by a trace")),
                outside => outside
                    .value()
                    .ok_or(missing("tensor alive (freed since the capture)"))?,
            },
        };
        let value = value
            .downcast::<T>()
            .map_err(|_| missing("value of its type"))?;
        Ok(Arc::try_unwrap(value).unwrap_or_else(|shared| (*shared).clone()))
    }

    /// Binds an op's output to its slot.
    pub(crate) fn bind<T: Send + Sync + 'static>(&mut self, slot: &Option<Slot>, value: T) {
        if let Some(slot) = slot {
            self.values.insert(slot.clone(), Arc::new(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use burn_backend::{DType, Shape};

    use super::*;

    static CLONES: AtomicUsize = AtomicUsize::new(0);

    /// A tensor stand-in: an allocation, a value, and a count of its clones.
    #[derive(Debug)]
    struct Fake {
        allocation: u64,
        value: i64,
    }

    impl Clone for Fake {
        fn clone(&self) -> Self {
            CLONES.fetch_add(1, Ordering::SeqCst);
            Self { ..*self }
        }
    }

    impl Allocated for Fake {
        fn allocation_id(&self) -> Option<AllocationId> {
            Some(AllocationId::unique(self.allocation))
        }
    }

    impl TensorMetadata for Fake {
        fn dtype(&self) -> DType {
            DType::I64
        }
        fn shape(&self) -> Shape {
            Shape::new([1])
        }
        fn rank(&self) -> usize {
            1
        }
    }

    /// Records `out = f(a, b)` as a step, as the forwarding macro does.
    fn binary(op: &'static str, a: &Fake, b: &Fake, out: Fake, f: fn(i64, i64) -> i64) -> Fake {
        let (a, b) = (input(op, a), input(op, b));
        let slot = output(op, &out);
        push(
            op,
            Box::new(move |env| {
                let (x, y): (Fake, Fake) = (env.take(&a)?, env.take(&b)?);
                let value = f(x.value, y.value);
                env.bind(
                    &slot,
                    Fake {
                        allocation: 0,
                        value,
                    },
                );
                Ok(())
            }),
        );
        out
    }

    /// Records `what = value`, a step reading it that keeps the result in `sink`.
    fn sink(value: &Fake, sink: Arc<std::sync::Mutex<i64>>) {
        let slot = input("sink", value);
        push(
            "sink",
            Box::new(move |env| {
                *sink.lock().unwrap() = env.take::<Fake>(&slot)?.value;
                Ok(())
            }),
        );
    }

    #[test]
    fn a_replay_runs_the_steps_on_what_was_read_from_outside() {
        let result = Arc::new(std::sync::Mutex::new(0));
        let started = Recording::begin().unwrap();
        assert!(
            Recording::begin().is_none(),
            "one program records at a time"
        );
        let x = Fake {
            allocation: 1,
            value: 3,
        };
        // y = x + x; y = y * x in place (its key again); sink(y).
        let y = binary(
            "add",
            &x,
            &x,
            Fake {
                allocation: 2,
                value: 6,
            },
            |a, b| a + b,
        );
        let y = binary(
            "mul",
            &y,
            &x,
            Fake {
                allocation: 2,
                value: 18,
            },
            |a, b| a * b,
        );
        sink(&y, Arc::clone(&result));
        let program = started.finish().unwrap();
        assert!(!recording());
        assert_eq!(program.ops(), ["add", "mul", "sink"]);

        let before = CLONES.load(Ordering::SeqCst);
        program.run().unwrap();
        assert_eq!(*result.lock().unwrap(), 18);
        // `x` is read three times from outside: cloned each time (the program keeps it);
        // `y` (both generations) is moved to its one reader.
        assert_eq!(CLONES.load(Ordering::SeqCst) - before, 3);
        program.run().unwrap();
        assert_eq!(
            *result.lock().unwrap(),
            18,
            "a replay starts from the same reads"
        );
    }

    #[test]
    fn an_unheld_recording_holds_nothing_from_outside_and_runs_on_what_it_is_handed() {
        let result = Arc::new(std::sync::Mutex::new(0));
        let started = Recording::begin_unheld().unwrap();
        let x = Fake {
            allocation: 11,
            value: 3,
        };
        let before = CLONES.load(Ordering::SeqCst);
        let y = binary(
            "add",
            &x,
            &x,
            Fake {
                allocation: 12,
                value: 6,
            },
            |a, b| a + b,
        );
        sink(&y, Arc::clone(&result));
        let program = started.finish().unwrap();
        assert_eq!(
            CLONES.load(Ordering::SeqCst),
            before,
            "a read from outside is named, not kept"
        );
        let missing = program.run().unwrap_err();
        assert_eq!(
            (missing.op, missing.what),
            ("add", "value handed over by a trace")
        );

        // What a trace saw read from outside: `x` with another value.
        let slot = Slot::new(key_of(&x).unwrap(), 0);
        let supplied = HashMap::from([(
            slot,
            Arc::new(Fake {
                allocation: 11,
                value: 5,
            }) as Value,
        )]);
        program.0.run_until(2, supplied, |_, _| {}).unwrap();
        assert_eq!(*result.lock().unwrap(), 10);
    }

    #[test]
    fn a_refused_op_refuses_the_program_and_a_dropped_recording_stops() {
        let started = Recording::begin().unwrap();
        refuse("max_pool2d_with_indices");
        refuse("later");
        assert_eq!(
            started.finish().unwrap_err(),
            NotEmulated {
                op: "max_pool2d_with_indices"
            }
        );
        let dropped = Recording::begin().unwrap();
        drop(dropped);
        assert!(!recording());
        // Nothing is recorded outside a recording.
        assert_eq!(
            input(
                "add",
                &Fake {
                    allocation: 9,
                    value: 0
                }
            ),
            None
        );
    }

    #[cfg(feature = "flex")]
    #[test]
    fn a_tensor_freed_since_the_capture_is_missing_at_replay() {
        use burn_backend::TensorData;
        use burn_flex::FlexTensor;

        let started = Recording::begin().unwrap();
        let outside = FlexTensor::from_data(TensorData::new(vec![1.0f32], [1]));
        let slot = input("neg", &outside);
        push(
            "neg",
            Box::new(move |env| env.take::<FlexTensor>(&slot).map(drop)),
        );
        let program = started.finish().unwrap();
        program.run().unwrap();
        drop(outside);
        let missing = program.run().unwrap_err();
        assert_eq!(missing.op, "neg");
        assert!(missing.what.contains("freed"), "{missing}");
    }
}
