"""The interface every engine plug-in module implements (module-level functions, all optional).

    check(spec)                      -> raise UsageError when the engine cannot run here (before launch)
    ds_config(spec)                  -> dict merged into ds_config.json (default: the YAML's ds_config)
    make_checkpoint_engine(ds_engine, spec)
                                     -> a deepspeed CheckpointEngine to install, or None to keep DeepSpeed's
    wait_durable(checkpoint_engine)  -> block until every file of the last save is on stable storage
    SAVES = False                    -> the engine writes no checkpoint (iteration-time baseline)
    PLAN = "predicted"               -> the planner's file names are this engine's (DeepSpeed's torch.save files);
                                        without it the plan shows DeepSpeed's logical files, "sizes only"

Plug-ins import torch and deepspeed inside functions only: the command line imports them to validate.
DeepSpeed's save_checkpoint / load_checkpoint drive whichever CheckpointEngine is installed, so the file
layout stays DeepSpeed's.
"""
