//! Training through `GraphCapture<Flex>` is bit-identical to training on `Flex`.

use burn::backend::{Autodiff, Flex};
use burn::optim::AdamConfig;
use burn_graph_capture::GraphCapture;
use lstm_example::train::{from_bytes, parameter_bits, to_bytes, train_eager};
use lstm_example::{LstmRegressorConfig, SineTask};

const SHAPE: (usize, usize) = (4, 8);
const STEPS: usize = 20;

#[test]
fn lstm_adam_training_is_bit_equal_to_the_inner_backend() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let config = LstmRegressorConfig::new(16);
    let bytes = to_bytes(config.init::<Flex>(&device));
    let mut plain = from_bytes::<Autodiff<Flex>>(&config, bytes.clone(), &device);
    let mut decorated = from_bytes::<Autodiff<GraphCapture<Flex>>>(&config, bytes, &device);
    assert!(parameter_bits(&plain) == parameter_bits(&decorated));

    let mut plain_optim = AdamConfig::new().init();
    let mut decorated_optim = AdamConfig::new().init();
    let plain_losses = train_eager(
        &mut plain,
        &mut plain_optim,
        &mut SineTask::new(3, 32),
        SHAPE,
        STEPS,
        1e-2,
    );
    let decorated_losses = train_eager(
        &mut decorated,
        &mut decorated_optim,
        &mut SineTask::new(3, 32),
        SHAPE,
        STEPS,
        1e-2,
    );

    let bits = |losses: &[f32]| losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&plain_losses), bits(&decorated_losses));
    assert!(
        plain_losses[STEPS - 1] < plain_losses[0],
        "training should make progress: {plain_losses:?}"
    );
    assert!(
        parameter_bits(&plain) == parameter_bits(&decorated),
        "parameters differ after training"
    );
}
