//! The forwarding macro behind `GraphCapture<B>`'s op traits.
//!
//! `ops/generated.rs` (written by `cargo run -p xtask -- gen-forward` from burn-backend's
//! trait definitions) lists every method with the kind of each argument and of its
//! result. This macro turns each line into a method that calls the same method of `B`
//! and, while a session is open, records the op: its signature, whether it breaks a
//! capture, which allocations it read and which it produced. While an emulated capture
//! records a program (`backend::emulated`), the op also adds its step to it; while a
//! trace matches a replayed step (`backend::trace`), the op is matched against the
//! graph's and hands back stand-ins instead of calling `B`. Outside a session the only
//! cost is one thread-local load.

/// Implements one op trait for `GraphCapture<B>` by forwarding to `B`.
macro_rules! forward_ops {
    (@breaker Op) => { None };
    // Moving a tensor to the device it already sits on returns it unchanged (Fusion,
    // CubeCL): nothing crosses devices, so nothing breaks a capture.
    (@breaker DeviceTransfer($device_of:ident, $tensor:ident, $device:ident)) => {
        if &B::$device_of(&$tensor) == $device {
            None
        } else {
            Some($crate::backend::session::BreakerKind::DeviceTransfer)
        }
    };
    // Served by a trainer's device generator inside its steps (`rng::serve`).
    (@breaker DeviceRandom($shape:ident, $device:ident, $dtype:ident)) => {
        $crate::backend::random::breaker::<B>(&$shape, $device, $dtype)
    };
    (@breaker $class:ident) => { Some($crate::backend::session::BreakerKind::$class) };

    (@record tensor, $rec:ident, $arg:ident) => { $rec.tensor(&$arg) };
    // Every op taking a tensor by reference reads only its metadata (device, flags).
    (@record tensor_ref, $rec:ident, $arg:ident) => { $rec.metadata($arg) };
    (@record tensors, $rec:ident, $arg:ident) => { $arg.iter().for_each(|t| $rec.tensor(t)) };
    (@record opt_tensor, $rec:ident, $arg:ident) => { $rec.optional(&$arg) };
    (@record data, $rec:ident, $arg:ident) => { $rec.data(&$arg) };
    (@record relabel, $rec:ident, $arg:ident) => {
        $crate::backend::relabel::Relabel::record(&$arg, $rec, false)
    };
    (@record attr, $rec:ident, $arg:ident) => { $rec.attr_value(&$arg) };
    (@record attr_ref, $rec:ident, $arg:ident) => { $rec.attr(&$arg) };

    (@output tensor, $rec:ident, $out:ident) => { $rec.output(&$out) };
    (@output pair, $rec:ident, $out:ident) => {{
        $rec.output(&$out.0);
        $rec.output(&$out.1);
    }};
    (@output relabel, $rec:ident, $out:ident) => {
        $crate::backend::relabel::Relabel::record(&$out, &mut $rec, true)
    };
    (@output plain, $rec:ident, $out:ident) => {};

    // While a capture reads constants through pins (`backend::constant_pin`), a
    // constant argument becomes its pin before anything records it.
    (@swap tensor, $arg:ident) => { $crate::backend::constant_pin::swap($arg) };
    (@swap tensors, $arg:ident) => {
        $arg.into_iter().map($crate::backend::constant_pin::swap).collect::<Vec<_>>()
    };
    (@swap opt_tensor, $arg:ident) => { $arg.map($crate::backend::constant_pin::swap) };
    (@swap $kind:ident, $arg:ident) => { $arg };

    (@arg relabel, $arg:ident) => { $crate::backend::relabel::Relabel::to_inner($arg) };
    (@arg $kind:ident, $arg:ident) => { $arg };

    // Ops the inner backend may run another way than its op trait does (`GraphBackend`).
    (@call float_matmul, $trait:ident, $lhs:expr, $rhs:expr) => {
        <B as $crate::backend::RoutedMatmul>::matmul($lhs, $rhs)
    };
    // `linear` and its multiplying gradients: `B`'s default arithmetic around that matmul.
    (@call linear, $trait:ident, $x:expr, $weight:expr, $bias:expr) => {
        $crate::backend::linear::linear::<B>($x, $weight, $bias)
    };
    (@call linear_x_backward, $trait:ident, $weight:expr, $grad:expr) => {
        $crate::backend::linear::linear_x_backward::<B>($weight, $grad)
    };
    (@call linear_weight_backward, $trait:ident, $x:expr, $grad:expr) => {
        $crate::backend::linear::linear_weight_backward::<B>($x, $grad)
    };
    (@call float_random, $trait:ident, $shape:expr, $distribution:expr, $device:expr, $dtype:expr) => {
        $crate::backend::random::float_random::<B>($shape, $distribution, $device, $dtype)
    };
    (@call $name:ident, $trait:ident, $($arg:expr),*) => { <B as $trait<B>>::$name($($arg),*) };

    (@ret relabel, $call:expr) => { $crate::backend::relabel::Relabel::from_inner($call) };
    (@ret $kind:ident, $call:expr) => { $call };

    // Emulated graphs (`backend::emulated`): what an op's replay keeps of each argument,
    // taken before the call consumes it: the slots of tensors, owned host attributes.
    (@keep tensor, $op:expr, $arg:ident) => {
        $crate::backend::emulated::program::input($op, &$arg)
    };
    (@keep tensors, $op:expr, $arg:ident) => {
        $arg.iter()
            .map(|t| $crate::backend::emulated::program::input($op, t))
            .collect::<Vec<_>>()
    };
    (@keep opt_tensor, $op:expr, $arg:ident) => {
        $arg.as_ref().map(|t| $crate::backend::emulated::program::input($op, t))
    };
    (@keep data, $op:expr, $arg:ident) => { $arg.clone() };
    (@keep attr, $op:expr, $arg:ident) => { $arg.clone() };
    (@keep attr_ref, $op:expr, $arg:ident) => { ::std::borrow::ToOwned::to_owned($arg) };
    // A metadata read: its op makes no tensor, so it has no step.
    (@keep tensor_ref, $op:expr, $arg:ident) => { $crate::backend::emulated::program::Unkept };
    // Burn structs over the backend: not replayed.
    (@keep $kind:ident, $op:expr, $arg:ident) => {{
        $crate::backend::emulated::program::refuse($op);
        $crate::backend::emulated::program::Unkept
    }};
    // ... and what it hands the op at replay.
    (@lend tensor, $env:ident, $kept:ident) => { $env.take($kept)? };
    (@lend tensors, $env:ident, $kept:ident) => {
        $kept.iter().map(|s| $env.take(s)).collect::<Result<Vec<_>, _>>()?
    };
    (@lend opt_tensor, $env:ident, $kept:ident) => {
        match $kept {
            Some(s) => Some($env.take(s)?),
            None => None,
        }
    };
    (@lend data, $env:ident, $kept:ident) => { $kept.clone() };
    (@lend attr, $env:ident, $kept:ident) => { $kept.clone() };
    (@lend attr_ref, $env:ident, $kept:ident) => { ::std::borrow::Borrow::borrow($kept) };
    (@lend $kind:ident, $env:ident, $kept:ident) => {
        unreachable!("a program that refused an op is never replayed")
    };

    (@slots tensor, $op:expr, $out:ident) => {
        [$crate::backend::emulated::program::output($op, &$out)]
    };
    (@slots pair, $op:expr, $out:ident) => {
        [
            $crate::backend::emulated::program::output($op, &$out.0),
            $crate::backend::emulated::program::output($op, &$out.1),
        ]
    };
    (@bind tensor, $env:ident, $slots:ident, $out:expr) => { $env.bind(&$slots[0], $out) };
    (@bind pair, $env:ident, $slots:ident, $out:expr) => {{
        let (first, second) = $out;
        $env.bind(&$slots[0], first);
        $env.bind(&$slots[1], second);
    }};

    // The op's step in the program: run again at replay, or its output as captured where
    // the op breaks a capture (a host-seeded draw is frozen into a device graph too).
    (@emulate plain, $name:ident, $trait:ident, $out:ident, $kept:ident, $breaker:ident,
        $rec:ident, ($($arg:ident: $kind:ident),*)) => {{
        let _ = $kept;
    }};
    (@emulate relabel, $name:ident, $trait:ident, $out:ident, $kept:ident, $breaker:ident,
        $rec:ident, ($($arg:ident: $kind:ident),*)) => {{
        let _ = $kept;
        $crate::backend::emulated::program::refuse(stringify!($name))
    }};
    (@emulate $ret_kind:ident, $name:ident, $trait:ident, $out:ident, $kept:ident,
        $breaker:ident, $rec:ident, ($($arg:ident: $kind:ident),*)) => {{
        let op = stringify!($name);
        let served_draw = op == "float_random" && $breaker.is_none();
        if !served_draw {
            // A draw from the trainer's generator recorded its own step
            // (`backend::random`).
            let slots = forward_ops!(@slots $ret_kind, op, $out);
            let run: $crate::backend::emulated::program::Thunk = if $breaker.is_some() {
                let frozen = $out.clone();
                Box::new(move |env| {
                    forward_ops!(@bind $ret_kind, env, slots, frozen.clone());
                    Ok(())
                })
            } else {
                // Ops with an argument the program refused are never replayed.
                #[allow(unreachable_code, unused, clippy::diverging_sub_expression)]
                Box::new(move |env| {
                    let ($($arg,)*) = &$kept;
                    let out = forward_ops!(
                        @call $name, $trait, $(forward_ops!(@lend $kind, env, $arg)),*
                    );
                    forward_ops!(@bind $ret_kind, env, slots, out);
                    Ok(())
                })
            };
            let stand_ins = forward_ops!(@stand_ins $ret_kind, $out);
            $crate::backend::emulated::program::push_traced(
                op, run, $rec.op_record(op), true, stand_ins,
            );
        }
    }};

    (@stand_ins tensor, $out:ident) => {
        $crate::backend::emulated::program::StandInValue::of(&$out).map(|s| vec![s])
    };
    (@stand_ins pair, $out:ident) => {
        $crate::backend::emulated::program::StandInValue::of(&$out.0)
            .zip($crate::backend::emulated::program::StandInValue::of(&$out.1))
            .map(|(first, second)| vec![first, second])
    };

    // Traces (`backend::trace`): the keys of the tensors an op reads, in the order the
    // recording took their slots ...
    (@trace_keys tensor, $keys:ident, $arg:ident) => {
        $keys.push($crate::backend::trace::input(&$arg))
    };
    (@trace_keys tensors, $keys:ident, $arg:ident) => {
        $keys.extend($arg.iter().map(|tensor| $crate::backend::trace::input(tensor)))
    };
    (@trace_keys opt_tensor, $keys:ident, $arg:ident) => {
        if let Some(tensor) = &$arg {
            $keys.push($crate::backend::trace::input(tensor))
        }
    };
    (@trace_keys $kind:ident, $keys:ident, $arg:ident) => {};
    // ... and the op matched against the graph's: a matched op returns its stand-ins. An
    // op making no tensor runs (metadata), unless it reads values on the host.
    (@trace plain, $name:ident, $rec:ident, $breaker:ident, ($($arg:ident: $kind:ident),*)) => {
        if $breaker.is_some() {
            $crate::backend::trace::unmatched(&$rec.op_record(stringify!($name)), *$breaker);
        }
    };
    (@trace relabel, $name:ident, $rec:ident, $breaker:ident, ($($arg:ident: $kind:ident),*)) => {
        $crate::backend::trace::unmatched(&$rec.op_record(stringify!($name)), *$breaker)
    };
    (@trace $ret_kind:ident, $name:ident, $rec:ident, $breaker:ident,
        ($($arg:ident: $kind:ident),*)) => {{
        let op = stringify!($name);
        // A draw from the trainer's generator is matched where it draws (`backend::random`).
        if !(op == "float_random" && $breaker.is_none()) {
            let mut keys = $crate::backend::trace::Inputs::new();
            $(forward_ops!(@trace_keys $kind, keys, $arg);)*
            if let Some(outputs) = $crate::backend::trace::matched(
                op, $rec, *$breaker, &keys, |stand_ins| forward_ops!(@hand_out $ret_kind, stand_ins),
            ) {
                if $crate::backend::trace::observing() {
                    // Recorded as the eager op would be, its stand-ins as its outputs.
                    let mut rec = $rec.clone();
                    forward_ops!(@output $ret_kind, rec, outputs);
                    rec.commit(op, *$breaker);
                }
                return outputs;
            }
        }
    }};
    (@hand_out tensor, $outputs:ident) => { $crate::backend::trace::hand_out(&$outputs, 0) };
    (@hand_out pair, $outputs:ident) => {
        (
            $crate::backend::trace::hand_out(&$outputs, 0),
            $crate::backend::trace::hand_out(&$outputs, 1),
        )
    };

    (
        $trait:ident;
        $(
            [$class:ident $(($($detail:ident),*))?]
            fn $name:ident($($arg:ident: $ty:ty as $kind:ident),* $(,)?)
                -> $ret:ty as $ret_kind:ident;
        )*
    ) => {
        impl<B: $crate::backend::GraphBackend> $trait<GraphCapture<B>> for GraphCapture<B> {
            $(
                #[allow(unused_mut)]
                fn $name($($arg: $ty),*) -> $ret {
                    // Inputs are recorded before the call, which consumes them.
                    // An op without arguments keeps `()`.
                    let recording = $crate::backend::session::is_recording();
                    $(let $arg = if recording { forward_ops!(@swap $kind, $arg) } else { $arg };)*
                    #[allow(clippy::unused_unit)]
                    let recorder = recording.then(|| {
                        let mut rec = $crate::backend::trace::recorder();
                        { let _rec = &mut rec; $(forward_ops!(@record $kind, _rec, $arg);)* }
                        let kept = $crate::backend::emulated::program::recording().then(|| {
                            ($(forward_ops!(@keep $kind, stringify!($name), $arg),)*)
                        });
                        (rec, forward_ops!(@breaker $class $(($($detail),*))?), kept)
                    });
                    if let Some((rec, breaker, _)) = &recorder
                        && $crate::backend::trace::active()
                    {
                        forward_ops!(@trace $ret_kind, $name, rec, breaker, ($($arg: $kind),*));
                    }
                    let out = forward_ops!(
                        @ret $ret_kind,
                        forward_ops!(@call $name, $trait, $(forward_ops!(@arg $kind, $arg)),*)
                    );
                    if let Some((mut rec, breaker, kept)) = recorder {
                        forward_ops!(@output $ret_kind, rec, out);
                        if let Some(kept) = kept {
                            forward_ops!(
                                @emulate $ret_kind, $name, $trait, out, kept, breaker, rec,
                                ($($arg: $kind),*)
                            );
                        }
                        rec.commit(stringify!($name), breaker);
                    }
                    out
                }
            )*
        }
    };
}

pub(crate) use forward_ops;
