"""The options of the commands other than a run, each a dataclass of declared keys (spec/keys.py)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass

from restart_harness.files import baseline
from restart_harness.plan import mlperf
from restart_harness.schema import CROSSOVER_RANGE_BYTES
from restart_harness.spec.keys import Path, Seconds, Size, key


@dataclass
class PlanOptions:
    plan: str = key("text", "output: text (a table) or json", group="plan", choices=("text", "json"))
    detail: str = key("summary", "text output: summary = totals, bytes per rank and the estimate; files = every file "
                                 "too, one line each, after the summary (json always lists them)", group="plan",
                      choices=("summary", "files"))
    bandwidth_gbps: float | None = key(None, "storage bandwidth for the estimate (both directions); default: the "
                                             "cached storage baseline of the checkpoint directory's file system",
                                       group="plan", unit="GB/s = 10^9 bytes/s", above=0)
    to_tp: int | None = key(None, "plan a restart at another layout too: its tensor-parallel degree (default the "
                                  "run's); shows the universal checkpoint and what each rank reads of it",
                            group="plan", minimum=1)
    to_pp: int | None = key(None, "... its pipeline-parallel degree (default the run's)", group="plan", minimum=1)
    to_dp: int | None = key(None, "... its data-parallel degree (default the run's)", group="plan", minimum=1)


@dataclass
class PredictOptions:
    predict: str = key("text", "output: text (a table) or json", group="predict", choices=("text", "json"))
    write_gbps: float | None = key(None, "the storage's aggregate write bandwidth (with read_gbps=); default: the "
                                         "cached storage baseline of the checkpoint directory's file system",
                                   group="predict", unit="GB/s = 10^9 bytes/s", above=0)
    read_gbps: float | None = key(None, "the storage's aggregate read bandwidth (with write_gbps=)", group="predict",
                                  unit="GB/s = 10^9 bytes/s", above=0)
    metadata_ops_s: float | None = key(None, "the storage's aggregate metadata rate: file creates and opens (object "
                                             "PUT and GET requests) per second, e.g. a parallel file system's "
                                             "metadata servers or S3's per-prefix request rate; each file costs one "
                                             "operation on top of its bytes; default: no such limit",
                                       group="predict", unit="operations/s", above=0)
    env_metadata_ops_s: float | None = key(None, "the metadata rate of the file system holding the Python "
                                                 "environment: opens, stats and listings per second, aggregate; "
                                                 "with it, imports and engine set-up carry every rank's operations "
                                                 "(configs/restart_io.json) over it: the import storm; default: no "
                                                 "such limit", group="predict", unit="operations/s", above=0)
    cpus_per_node: int | None = key(None, "CPU cores per node; default this machine's", group="predict", minimum=1)
    crossover_min_bytes: Size = key(Size(CROSSOVER_RANGE_BYTES[0]), "the smallest checkpoint the crossover looks at (the "
                                    "checkpoint size from which the load is the largest restart phase: "
                                    "docs/prediction.md#the-crossover)", group="predict", unit="bytes", minimum=1024)
    crossover_max_bytes: Size = key(Size(CROSSOVER_RANGE_BYTES[1]), "the largest checkpoint it looks at (above "
                                    "crossover_min_bytes)", group="predict", unit="bytes", minimum=1024)


@dataclass
class CalibrateOptions:
    runs: str = key(MISSING, "finished run directories, or folders holding them (searched below), comma-separated",
                    group="calibrate")
    out: Path = key(MISSING, "the calibration file to write, e.g. out=configs/calibration/mycluster.json (then "
                             "calibration=mycluster)", group="calibrate")
    device: str = key("all", "the runs to fit: those that computed on this device (cpu, cuda; a GPU cluster's run "
                             "folders brought here), or all", group="calibrate", choices=("all", "cpu", "cuda"))
    base: str | None = key(None, "a calibration (name or path) whose groups are kept: the runs' fits add the groups "
                                 "it lacks (another engine, launcher or device)", group="calibrate")


@dataclass
class BaselineOptions:
    dir: Path = key(MISSING, "the directory (file system) to measure, e.g. dir=/scratch/ckpt, or an object store: "
                             "dir=s3://bucket/prefix (PUT and GET)", group="baseline")
    tool: str = key("auto", "auto = fio when installed, else the built-in probe", group="baseline",
                    choices=baseline.TOOLS)
    file_bytes: Size = key(Size(baseline.DEFAULT_FILE_BYTES), "bytes each rank writes and reads", group="baseline", unit="bytes",
                           minimum=1)
    ranks: int | None = key(None, f"concurrent writers/readers; default the CPU count, at most {baseline.AUTO_MAX_RANKS}",
                            group="baseline", minimum=1)


@dataclass
class CleanOptions:
    folder: Path = key("results", "the runs to clean: a results folder, a sweep folder or one run directory, searched "
                                  "recursively", group="clean")
    older_than_hours: float | None = key(None, "only runs that finished more than this many hours ago",
                                         group="clean", unit="h", minimum=0)
    larger_than: Size | None = key(None, "only checkpoints larger than this", group="clean", unit="bytes", minimum=0)
    prefix: str | None = key(None, "only runs whose folder name starts with this (tiny-, 70B-tp8)", group="clean")
    apply: bool = key(False, "delete; by default only list what would be deleted and its total", group="clean")


# The matrix's cases beyond DeepSpeed's engines: another training stack with its engine (docs/fsdp2.md).
MATRIX_STACK_CASES = {"fsdp2-dcp": ["stack=fsdp2", "engine=dcp"]}


@dataclass
class MatrixOptions:
    device: str = key("auto", "auto = cuda when NVIDIA devices are present, else cpu (the CPU subset)",
                      group="matrix", choices=("auto", "cpu", "cuda"))
    model: str | None = key(None, "model preset; default 1B on cuda, tiny on cpu", group="matrix")
    engines: str = key("all", "comma list of engines (and fsdp2-dcp: stack=fsdp2 with DCP), or all (every engine "
                              "that saves, and fsdp2-dcp)", group="matrix")
    layouts: str = key("auto", "comma list of layouts as tpT-ppP-dpD, or auto: those that fit the node's devices "
                               "(cpu: tp1-pp1-dp2 and tp2-pp2-dp1)", group="matrix")
    gpus: int | None = key(None, "devices on the node (default: the NVIDIA devices found)", group="matrix", minimum=1)
    launcher: str = key("local", "what starts each case's ranks on this node (a launcher= value: local, prefork, ...)",
                        group="matrix")
    keep: bool = key(False, "keep each case's checkpoint; false: deleted once the case's records are written (its "
                            "records and the report stay), so the cases fit a node's disk one after another",
                     group="matrix")
    results_dir: Path = key(Path("results/matrix"), "where the matrix's runs, matrix.json and its report go",
                            group="matrix")


@dataclass
class RestartOptions:
    run: Path = key(MISSING, "the run directory an earlier run printed", group="restart")


@dataclass
class MlperfOptions:
    runs: int = key(mlperf.RUNS, "MLPerf runs, each its own harness run; MLPerf's metrics are the mean over them "
                                 "(MLPerf: 5)", group="mlperf", minimum=1)
    checkpoints: int = key(mlperf.CHECKPOINTS, "checkpoints each run writes (MLPerf: 10)", group="mlperf",
                           minimum=1)
    reads: int = key(mlperf.READS, "checkpoint reads of each run, each a restart in fresh processes after the page "
                                   "cache is dropped (MLPerf: 10)", group="mlperf", minimum=1)


# Run keys the workload fixes (its model, layout, ZeRO stage, emulation with DeepSpeed's own files, fsync'd saves
# and a cold read): an mlperf command refuses them.
MLPERF_FIXED = ("tp", "pp", "dp", "zero", "stack", "engine", "emulate", "iters", "save_interval", "after", "cache",
                "phase", "repeats", "precision", "replicate")


@dataclass
class StudyOptions:
    models: str = key("3B,13B,70B", "model presets (or .yaml presets), comma-separated", group="study")
    gpus: str = key("8,16", "GPU counts, comma-separated: each gives its own rows (default one 8-GPU node, and two)",
                    group="study")
    gpus_per_node: int = key(8, "GPUs (ranks) per node: tensor parallel stays within a node; the files per node",
                             group="study", minimum=1, maximum=1024)
    target_device: str = key("cuda", "the device the cells' real-size predictions are for: cuda (the study's GPUs) "
                                     "or cpu; start-up is predicted only by a calibration with runs on it "
                                     "(calibration=; calibrate device=cuda brings a GPU cluster's in)", group="study",
                              choices=("cpu", "cuda"))
    strategies: str = key("auto", "auto = pure data, tensor and pipeline parallel and their mixes the model's shape "
                                  "and the GPUs' memory allow (docs/study.md); or a comma list of tpT, ppP, dp and "
                                  "their mixes (tp4-pp2; dp fills the GPU count, or tp4-pp2-dp2 names it)",
                          group="study")
    engines: str = key("default,torchsnapshot,datastates", "checkpoint engines, comma-separated; +NAME,... adds to "
                                                           "the three defaults", group="study")
    vocab: str = key("reference", "reference = the reference study's vocabulary: GPT-2's 50,257 tokens padded as "
                                  "Megatron-DeepSpeed pads them, to a multiple of 128 x tp; preset = the preset's own",
                     group="study", choices=("reference", "preset"))
    gpu_memory_gib: float | None = key(80.0, "memory of one GPU: a strategy whose model state on a GPU (weights, "
                                             "gradients, its ZeRO optimizer partition; activations left out) does "
                                             "not fit is not placed; none = place whatever the shape allows",
                                       group="study", unit="GiB", above=0)
    reference: bool = key(True, "add the reference study's logged layout (3B tp4-pp1-dp1 on one 4-GPU node) with "
                                "its log's checkpoint size and file names beside the planner's", group="study")
    fidelity: str = key("auto", "auto = each cell the most faithful option that fits the disk and the time left (a "
                                "real run, emulation at real size, shrunk with the file layout kept, else predicted); "
                                "real, emulated, shrunk or predicted = that for every cell whose engine runs here, "
                                "refused if it does not fit", group="study",
                        choices=("auto", "real", "emulated", "shrunk", "predicted"))
    time_limit: float = key(25.0, "the study's wall time, planning and the table included: cells are sized to it "
                                  "and a run still going at the end is stopped (resume= continues)", group="study",
                            unit="min", above=0, maximum=40320)
    disk: Size | None = key(None, "checkpoint bytes a cell may write (each cell's checkpoint is deleted once its "
                                  "records are written, unless keep=true); default the free space where the "
                                  "checkpoints go less 10 GiB, or half of it where that is more", group="study", unit="bytes", minimum=1)
    saves: int = key(1, "checkpoints each run writes", group="study", minimum=1, maximum=100)
    resume: Path | None = key(None, "continue the study in this folder: its cells not yet finished, with its own "
                                    "keys (time_limit= may be given anew)", group="study")


# Run keys a study sets for each cell (its layout, the cell's option, the run's steps): a study command refuses them.
STUDY_FIXED = ("tp", "pp", "dp", "nodes", "ranks_per_node", "shrink", "emulate", "subset", "engine", "stack", "iters",
               "save_interval", "after", "phase", "repeats", "max_runs", "dry_run", "replicate")


# Run keys the failure campaign fixes (it trains once, for real, restarts and keeps its checkpoints): refused.
ENDURE_FIXED = ("phase", "keep", "dry_run", "repeats")


@dataclass
class EndureOptions:
    duration: Seconds = key(MISSING, "the failure campaign's wall-clock budget (failures arrive at mtbf=, a run key: "
                                     "the job's mean time between failures, drawn from seed=)", group="endure",
                            unit="seconds", above=0)
    failures: str = key("rank,job,save", "what a failure kills, drawn in turn from this list: rank (one rank "
                                         "SIGKILLed), job (the whole job), save (a rank killed inside a save)",
                        group="endure")
