"""engine=default: DeepSpeed's own TorchCheckpointEngine (one torch.save per file, synchronous). To an s3:// ckpt_dir,
the same torch.save and torch.load through s3torchconnector's checkpoint streams (S3Checkpoint writer and reader):
the object is complete, hence durable, when the writer's multipart upload completes."""

from engines.base import Engine


class DefaultEngine(Engine):
    name = "default"
    description = "DeepSpeed TorchCheckpointEngine - torch.save of each state dict, synchronous"
    planned_names = True
    reshard = "universal"
    s3 = True

    def checkpoint_engine(self, ds_engine):
        return None if self.store is None else _s3_engine_class()(self.store)


def _s3_engine_class():
    import torch
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from s3torchconnector import S3Checkpoint

    class S3TorchCheckpointEngine(TorchCheckpointEngine):
        """torch.save / torch.load of each state dict into / from the object its DeepSpeed path names."""

        def __init__(self, store):
            super().__init__()
            self.name = "S3TorchCheckpointEngine"
            self.store = store
            s = store.settings
            self.streams = S3Checkpoint(s.region, endpoint=s.endpoint_url, s3client_config=s.client_config())

        def makedirs(self, path, exist_ok=False):
            pass  # objects need no folders; the local index gets its placeholders in save()

        def save(self, state_dict, path: str):
            with self.store.timed(self.streams.writer(str(self.store.url_of(path))), "write") as stream:
                torch.save(state_dict, stream)
            self.store.placeholder(path)

        def load(self, path: str, map_location=None):
            with self.store.timed(self.streams.reader(str(self.store.url_of(path))), "read") as stream:
                return torch.load(stream, map_location=map_location, weights_only=False)

    return S3TorchCheckpointEngine
