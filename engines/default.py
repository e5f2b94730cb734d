"""engine=default: DeepSpeed's own TorchCheckpointEngine (one torch.save per file)."""

SAVES = True
PLAN = "predicted"  # the planner predicts this engine's file names (TorchCheckpointEngine: one torch.save each)


def make_checkpoint_engine(ds_engine, spec):
    return None  # keep the engine DeepSpeed configured
