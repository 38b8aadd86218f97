"""Whole-checkpoint throughput of ``layoutc convert`` against reading the same files (issue 15).

    python3 benchmarks/checkpoint_throughput.py one [--size-gb 16] [--device cuda] [--out DIR]
    python3 benchmarks/checkpoint_throughput.py two [--size-gb 16]      # a machine with 2 GPUs

``one`` (one GPU): writes a synthetic vLLM-layout checkpoint (gpt-oss-120b MoE dims, MXFP4,
bf16 attention/embeddings copied through; ``layoutc.convert.synthckpt``) to the local disk, then
  * reads it: ``cat > /dev/null`` and a Python read loop (1 and 4 threads), warm (page cache);
  * copies it (``copy``): every shard read and written to a new folder on the same disk, fsynced
    and renamed, by as many reader and writer threads as the converter's defaults: the I/O a
    conversion cannot avoid, next to which the convert's GB/s is judged (summary ``ratio_*_copy``);
  * converts it with ``layoutc convert --device cuda`` (the pipeline, default knobs), warm, with
    ``--profile`` for the stage breakdown; checks the output (every file's sha256 against the
    sequential loop's, a CPU conversion of 2 experts of 2 layers, the GPU eager reference);
  * then, as time allows: the sequential loop (``--prefetch 0``), cold reads and a cold convert
    (each input file's cached pages dropped with posix_fadvise after an fsync; the disk below the
    VM may still cache), the same on tmpfs (no disk at all), and other pipeline knobs.
``ab`` (any machine, made for the CPU): a plain copy of the same files (``shutil.copyfile`` of each
file, fsynced), ``layoutc convert`` of this tree and of ``--old`` (another checkout: before), each in a
fresh process, in alternation for ``--rounds`` rounds, the input's page cache dropped (``--cache
cold``, the default) or read once (``--cache warm``) before every step; per step the whole run (the
process: imports, the spec's compilation, the conversion, the index and manifest) and the conversion
alone (``--profile``'s wall time of ``convert_checkpoint``), with the process's CPU seconds; the
summary holds the medians and the ratios to the copy of the same round.
``two`` (two GPUs): the same checkpoint converted by one rank, by 2 torchrun ranks (NCCL, shards
split by bytes), and with ``-D tp_size=2`` (every slice from one read) by one and by 2 ranks:
throughput ratios and every output file compared with the one-rank run's.

Every step is skipped when the time left (``--budget-s``) would not cover it. Results: JSON and a
log under ``--out`` (default ``$OUT``); a compact table last on stdout. GB/s counts the input
checkpoint's bytes over wall time (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.convert import shardio  # noqa: E402
from layoutc.convert.checkpoint import PREFETCH, WRITERS, convert_checkpoint  # noqa: E402
from layoutc.algebra.dtypes import bit_view  # noqa: E402
from layoutc.convert.synthckpt import PREFIX, moe_layer_bytes, sized, write_checkpoint  # noqa: E402

SPEC = ROOT / "specs" / "flashinfer_cutlass_mxfp4_padded.lyt"
GPT_OSS_120B = {"E": 128, "I": 2880, "H": 2880}
CHUNK = 16 << 20


class Bench:
    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / f"ckpt_{args.mode}.log"
        self.log_file = open(self.log_path, "w")
        self.results: dict = {"mode": args.mode, "argv": sys.argv[1:], "steps": {}, "skipped": [], "errors": []}
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                        PYTHONUNBUFFERED="1")

    # -- plumbing --------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.args.budget_s - self.elapsed()

    def fits(self, name: str, estimate: float) -> bool:
        if estimate > self.left():
            self.log(f"skip {name}: needs ~{estimate:.0f} s, {self.left():.0f} s left")
            self.results["skipped"].append({"step": name, "estimate_s": round(estimate, 1), "left_s": round(self.left(), 1)})
            return False
        return True

    def save(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        (self.out / f"ckpt_{self.args.mode}.json").write_text(json.dumps(self.results, indent=1, default=str))

    def step(self, name: str, value) -> None:
        self.results["steps"][name] = value
        self.save()

    def error(self, where: str, err: BaseException | str) -> None:
        self.log(f"ERROR in {where}: {err}")
        self.results["errors"].append({"where": where, "error": str(err)[-2000:]})
        self.save()

    # -- measurements --------------------------------------------------------------------------

    def cli(self, name: str, in_dir: Path, out_dir: Path, extra: list[str], ranks: int = 0, tree: Path = ROOT) -> dict:
        """``layoutc convert`` in a fresh process (``ranks`` > 0: under torchrun); wall time and the
        per-rank ``--profile`` reports. ``tree``: the checkout whose ``layoutc`` runs (its folder is the
        working directory and PYTHONPATH: ``python -m`` puts the working directory first)."""
        prof = out_dir.parent / f".{out_dir.name}-profile.json"
        for p in out_dir.parent.glob(f".{out_dir.name}-profile*.json"):
            p.unlink()
        base = ["-m", "layoutc", "convert", "--spec", str(self.args.spec), "--in", str(in_dir),
                "--out", str(out_dir), "--profile", str(prof), *self.spec_defines(), *extra]
        if ranks:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *base]
        else:
            cmd = [sys.executable, *base]
        self.log(f"run {name}: {' '.join(cmd[1:])}")
        t = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            env = self.env if tree == ROOT else dict(self.env, PYTHONPATH=str(tree))
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree,
                                  timeout=max(10.0, self.args.hard_s - self.elapsed()))
        except subprocess.TimeoutExpired as err:
            self.error(name, f"timed out after {err.timeout:.0f} s")
            return {"ok": False, "wall_s": time.perf_counter() - t}
        wall = time.perf_counter() - t
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the whole process's CPU, any tree
        cpu = ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime
        tail = [ln for ln in proc.stderr.splitlines() if "converting" not in ln][-8:]
        for ln in tail:
            self.log(f"    | {ln}")
        profiles = []
        for p in sorted(out_dir.parent.glob(f".{out_dir.name}-profile*.json")):
            profiles.append(json.loads(p.read_text()))
            p.unlink()
        res = {"name": name, "ok": proc.returncode == 0, "rc": proc.returncode, "wall_s": round(wall, 3),
               "whole_cpu_s": round(cpu, 3),
               "profiles": profiles}
        if proc.returncode != 0:
            self.error(name, "\n".join(proc.stderr.splitlines()[-15:]))
        else:
            convert_s = max(p["wall_s"] for p in profiles) if profiles else wall
            res["convert_s"] = round(convert_s, 3)
            res["gbps_wall"] = round(self.in_bytes / wall / 1e9, 3)
            res["gbps_convert"] = round(self.in_bytes / convert_s / 1e9, 3)
            if profiles and "process_cpu_s" in profiles[0]:
                res["process_cpu_s"] = profiles[0]["process_cpu_s"]
            self.log(f"  {name}: {wall:.1f} s wall ({res['gbps_wall']:.2f} GB/s), "
                     f"{convert_s:.1f} s in convert ({res['gbps_convert']:.2f} GB/s)")
        return res

    def spec_defines(self) -> list[str]:
        return [x for kv in self.args.define for x in ("-D", kv)]

    def read_python(self, files: list[Path], threads: int = 1) -> float:
        def one(path: Path) -> int:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            n = 0
            with open(path, "rb", buffering=0) as f:
                while True:
                    k = f.readinto(view)
                    if not k:
                        return n
                    n += k

        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(one, files))
        assert total == self.in_bytes, (total, self.in_bytes)
        return time.perf_counter() - t

    def read_cat(self, files: list[Path]) -> float:
        t = time.perf_counter()
        subprocess.run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *map(str, files)], check=True)
        return time.perf_counter() - t

    def reads(self, name: str, files: list[Path], which=("cat", "python", "python4")) -> dict:
        res = {}
        for how in which:
            s = self.read_cat(files) if how == "cat" else self.read_python(files, 4 if how == "python4" else 1)
            res[how] = {"s": round(s, 3), "gbps": round(self.in_bytes / s / 1e9, 3)}
            self.log(f"  read {name} {how}: {s:.2f} s, {res[how]['gbps']:.2f} GB/s")
        return res

    def copy(self, files: list[Path], dest: Path) -> dict:
        """Read every file and write it into ``dest`` (same disk) as the converter's I/O does:
        ``PREFETCH`` reader threads, ``WRITERS`` writer threads, each file written to a temporary
        name, fsynced by its writer, renamed, the folder fsynced at the end. At most
        ``PREFETCH + WRITERS`` files in memory, like the converter's shards in flight."""
        self.remove(dest)
        dest.mkdir(parents=True)

        def read(path: Path) -> tuple[Path, bytearray]:
            buf = bytearray(path.stat().st_size)
            view, got = memoryview(buf), 0
            with open(path, "rb", buffering=0) as f:
                while got < len(buf):
                    n = f.readinto(view[got:got + CHUNK])
                    if not n:
                        raise OSError(f"{path}: ended early")
                    got += n
            return path, buf

        def write(item: tuple[Path, bytearray]) -> int:
            path, buf = item
            tmp = dest / f".{path.name}.tmp"
            view = memoryview(buf)
            with open(tmp, "wb", buffering=0) as f:
                for a in range(0, len(buf), CHUNK):
                    f.write(view[a:a + CHUNK])
                os.fsync(f.fileno())
            os.replace(tmp, dest / path.name)
            return len(buf)

        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(PREFETCH) as readers, \
                concurrent.futures.ThreadPoolExecutor(WRITERS) as writers:
            reads = [readers.submit(read, p) for p in files[:PREFETCH + WRITERS]]
            writes, nxt = [], len(reads)
            for r in reads:  # bounded: a new read starts only when a read is handed to a writer
                writes.append(writers.submit(write, r.result()))
                if nxt < len(files):
                    reads.append(readers.submit(read, files[nxt]))
                    nxt += 1
                if len(writes) > WRITERS:
                    writes[-WRITERS - 1].result()
            total = sum(w.result() for w in writes)
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        s = time.perf_counter() - t
        assert total == self.in_bytes, (total, self.in_bytes)
        self.remove(dest)
        res = {"s": round(s, 3), "gbps": round(self.in_bytes / s / 1e9, 3), "readers": PREFETCH, "writers": WRITERS}
        self.log(f"  copy (read, write, fsync; {PREFETCH} readers, {WRITERS} writers): {s:.2f} s, {res['gbps']:.2f} GB/s")
        return res

    def drop(self, folder: Path) -> bool:
        ok = all([shardio.drop_cache(p) for p in sorted(folder.rglob("*")) if p.is_file()])
        return ok

    def digest(self, folder: Path) -> dict[str, str]:
        files = [p for p in sorted(folder.rglob("*")) if p.is_file() and ".layoutc-lock" not in p.name]

        def one(p: Path) -> str:
            with open(p, "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest()

        with concurrent.futures.ThreadPoolExecutor(min(16, os.cpu_count() or 4)) as pool:
            return dict(zip((str(p.relative_to(folder)) for p in files), pool.map(one, files)))

    def compare(self, name: str, got: dict, want: dict, other_input: bool = False) -> bool:
        if other_input:  # the manifest names the input folder
            got, want = ({k: v for k, v in d.items() if not k.endswith("layoutc_manifest.json")} for d in (got, want))
        same = got == want
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        self.log(f"  {name}: {'identical' if same else 'DIFFERENT'} ({len(got)} files{'' if same else ', ' + ', '.join(diff[:4])})")
        if not same:
            self.results["errors"].append({"where": name, "error": f"outputs differ: {diff[:10]}"})
        return same

    def remove(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    # -- setup ---------------------------------------------------------------------------------

    def environment(self) -> None:
        a = self.args
        info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                "device": a.device, "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                "layoutc": layoutc.__version__}
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        try:
            st = os.statvfs(a.dir.parent if not a.dir.exists() else a.dir)
            info["disk_free_gb"] = round(st.f_bavail * st.f_frsize / 1e9, 1)
        except OSError:
            pass
        info["fs"] = _mount_of(a.dir)
        info["shm"] = _mount_of(Path("/dev/shm"))
        try:
            info["meminfo"] = {ln.split(":")[0]: ln.split(":")[1].strip() for ln in open("/proc/meminfo")
                               if ln.startswith(("MemTotal", "MemAvailable", "Dirty"))}
            info["vm"] = {k: open(f"/proc/sys/vm/{k}").read().strip() for k in ("dirty_ratio", "dirty_background_ratio")}
        except OSError:
            pass
        self.log(f"environment: {json.dumps(info)}")
        self.step("environment", info)

    def micro(self) -> None:
        """Ceilings of the pieces: sha256 (one stream, and the tree digest on the default hashing
        pool), pinned allocation, host<->device copies."""
        res = {}
        buf = bytearray(512 << 20)
        t = time.perf_counter()
        hashlib.sha256(buf).digest()
        res["sha256_gbps"] = round(len(buf) / (time.perf_counter() - t) / 1e9, 3)
        # the stamps' tree digest on the default pool: the ceiling of hashing in convert
        with shardio.hash_pool() as pool:
            t = time.perf_counter()
            tree = shardio.TreeHash(pool)
            tree.update(buf)
            tree.hexdigest()
            res["sha256_tree_gbps"] = round(len(buf) / (time.perf_counter() - t) / 1e9, 3)
        res["hash_threads"] = shardio.HASH_THREADS
        if self.args.device.startswith("cuda"):
            n = 1 << 30
            t = time.perf_counter()
            pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            res["pin_alloc_gbps"] = round(n / (time.perf_counter() - t) / 1e9, 3)
            pageable = torch.ones(n, dtype=torch.uint8)
            dev = torch.empty(n, dtype=torch.uint8, device=self.args.device)
            for name, src, dst in (("h2d_pinned", pinned, dev), ("h2d_pageable", pageable, dev),
                                   ("d2h_pinned", dev, pinned), ("d2h_pageable", dev, pageable)):
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(3):
                    dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                res[name + "_gbps"] = round(3 * n / (time.perf_counter() - t) / 1e9, 2)
            del pinned, pageable, dev
            torch.cuda.empty_cache()
        self.log(f"micro: {res}")
        self.step("micro", res)

    def generate(self) -> None:
        a = self.args
        spec = layoutc.compile_file(a.spec, _defines(a.define))
        size = int(a.size_gb * 1e9)
        dims, layers, vocab = sized(spec, size, _dims(a.dims))
        shard = int(a.shard_gb * 1e9) if a.shard_gb else min(2_000_000_000, max(size // 8, 1))
        in_dir = a.dir / "in"
        if in_dir.exists():
            self.remove(in_dir)
        gen_device = a.device if a.device.startswith("cuda") else "cpu"
        self.log(f"generate: {size / 1e9:.1f} GB, {layers} MoE layers of {moe_layer_bytes(spec, dims) / 1e9:.3f} GB "
                 f"{dims}, vocab {vocab}, shards of ~{shard / 1e9:.2f} GB, on {gen_device}, into {in_dir}")
        info = write_checkpoint(in_dir, spec, dims, layers, shard, vocab=vocab, seed=1, device=gen_device,
                                log=self.log)
        if gen_device.startswith("cuda"):
            torch.cuda.empty_cache()
        self.in_dir = in_dir
        self.files = sorted(in_dir.glob("*.safetensors"))
        self.in_bytes = sum(p.stat().st_size for p in self.files)
        self.dims, self.layers = dims, layers
        info = {k: v for k, v in info.items() if k != "files"} | {
            "write_gbps_incl_fsync": round(self.in_bytes / info["seconds"] / 1e9, 3), "sizes_gb":
            [round(p.stat().st_size / 1e9, 3) for p in self.files]}
        self.log(f"  {info['shards']} shards, {self.in_bytes / 1e9:.2f} GB in {info['seconds']:.1f} s "
                 f"({info['write_gbps_incl_fsync']:.2f} GB/s written incl. fsync)")
        self.step("generate", info)

    # -- correctness -------------------------------------------------------------------------------

    def smoke(self) -> None:
        """In-process, small (2 experts, real I and H): the pipeline on the device against the
        sequential loop, and against the CPU. On failure the big runs use ``--prefetch 0``."""
        a = self.args
        spec = layoutc.compile_file(a.spec, _defines(a.define))
        small = a.dir / "smoke"
        self.remove(small)
        dims = dict(self.dims, E=2)
        write_checkpoint(small / "in", spec, dims, 3, moe_layer_bytes(spec, dims) + 1, vocab=512, seed=3, device="cpu")
        res = {}
        try:
            t = time.perf_counter()
            convert_checkpoint(spec, small / "in", small / "pipe", device=a.device, prefetch=2, writers=2)
            res["pipelined_s"] = round(time.perf_counter() - t, 2)
            convert_checkpoint(spec, small / "in", small / "seq", device=a.device, prefetch=0)
            convert_checkpoint(spec, small / "in", small / "cpu", device="cpu", prefetch=0, verify=False)
            d_pipe, d_seq, d_cpu = self.digest(small / "pipe"), self.digest(small / "seq"), self.digest(small / "cpu")
            shards = lambda d: {k: v for k, v in d.items() if k.endswith(".safetensors")}  # noqa: E731
            res["pipelined_equals_sequential"] = d_pipe == d_seq
            res["device_equals_cpu"] = shards(d_pipe) == shards(d_cpu)
        except Exception as err:  # noqa: BLE001 -- recorded; the big runs fall back
            self.error("smoke", repr(err))
            res["exception"] = repr(err)
        ok = res.get("pipelined_equals_sequential") and res.get("device_equals_cpu")
        if not ok and "--prefetch" not in a.extra:
            self.log("  smoke test failed: the big runs use --prefetch 0")
            a.extra = [*a.extra, "--prefetch", "0"]
        res["ok"] = bool(ok)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the conversions run in other processes
        self.log(f"  smoke: {res}")
        self.step("smoke", res)
        self.remove(small)

    def spot_check(self, out_dir: Path) -> None:
        """2 experts of the first and last MoE layer: the converted file against a CPU conversion
        of the same experts from the input (experts are converted independently)."""
        from safetensors import safe_open

        spec = layoutc.compile_file(self.args.spec, _defines(self.args.define))
        index = json.loads((self.in_dir / "model.safetensors.index.json").read_text())["weight_map"]
        checked, ok = [], True
        lo = min(1, self.dims["E"] - 1)
        hi = min(self.dims["E"], lo + 2)
        for layer in sorted({0, self.layers - 1}):
            head = PREFIX.format(layer)
            inputs = {}
            for n in spec.input_names:
                with safe_open(str(self.in_dir / index[f"{head}.{n}"]), "pt") as h:
                    inputs[n] = h.get_slice(f"{head}.{n}")[lo:hi]
            want = spec.convert(inputs)
            for n, v in want.items():
                with safe_open(str(out_dir / index[f"{head}.{n}"]), "pt") as h:
                    got = h.get_slice(f"{head}.{n}")[lo:hi]
                same = got.dtype == v.dtype and got.shape == v.shape and torch.equal(bit_view(got), bit_view(v))
                ok &= same
                checked.append(f"{head}.{n}[{lo}:{hi}]" + ("" if same else " DIFFERS"))
        self.log(f"  spot check vs CPU: {'ok' if ok else 'FAILED'} ({len(checked)} tensors)")
        self.step("spot_check", {"ok": ok, "checked": checked})
        if not ok:
            self.results["errors"].append({"where": "spot_check", "error": "converted experts differ from the CPU"})

    # -- modes ---------------------------------------------------------------------------------

    def one(self) -> None:
        a = self.args
        dev = ["--device", a.device]
        self.step("warm_read", self.reads("warm", self.files))
        read_best = max(v["gbps"] for v in self.results["steps"]["warm_read"].values())
        copy = None
        if self.fits("warm_copy", self.in_bytes / 1e9 / 0.5 + 10):  # pessimistic: 0.5 GB/s
            try:
                copy = self.copy(self.files, a.dir / "copy")
                self.step("warm_copy", copy)
            except Exception as err:  # noqa: BLE001 -- recorded, the run goes on
                self.error("warm_copy", repr(err))
                self.remove(a.dir / "copy")
        est = self.in_bytes / 1e9 / 0.5 + 30  # pessimistic: 0.5 GB/s
        pipe = a.dir / "out-pipe"
        if not self.fits("convert_pipelined_warm", est):
            return
        r = self.cli("pipelined_warm", self.in_dir, pipe, dev + a.extra)
        self.step("convert_pipelined_warm", r)
        if not r["ok"]:
            return
        ref = self.digest(pipe)
        try:
            self.spot_check(pipe)
        except Exception as err:  # noqa: BLE001 -- recorded, the run goes on
            self.error("spot_check", repr(err))
        self.remove(pipe)
        t_pipe = r["wall_s"]
        self.results["summary"] = {"read_gbps_best_warm": read_best, "convert_gbps_wall": r["gbps_wall"],
                                   "convert_gbps_in_convert": r["gbps_convert"],
                                   "ratio_wall": round(r["gbps_wall"] / read_best, 3),
                                   "ratio_in_convert": round(r["gbps_convert"] / read_best, 3)}
        if copy:
            self.results["summary"].update({"copy_gbps_warm": copy["gbps"],
                                            "ratio_wall_copy": round(r["gbps_wall"] / copy["gbps"], 3),
                                            "ratio_in_convert_copy": round(r["gbps_convert"] / copy["gbps"], 3)})
        self.save()
        if self.fits("convert_sequential_warm", 4 * t_pipe + 20):
            out = a.dir / "out-seq"
            s = self.cli("sequential_warm", self.in_dir, out, dev + ["--prefetch", "0"])
            s["identical_to_pipelined"] = s["ok"] and self.compare("sequential == pipelined", self.digest(out), ref)
            self.step("convert_sequential_warm", s)
            self.remove(out)
        if self.fits("cold", 2 * t_pipe + self.in_bytes / 1e9 + 20):
            cold = {"dropped": self.drop(self.in_dir)}
            s = self.read_python(self.files)
            cold["read_python"] = {"s": round(s, 3), "gbps": round(self.in_bytes / s / 1e9, 3)}
            self.log(f"  read cold python: {s:.2f} s, {cold['read_python']['gbps']:.2f} GB/s")
            self.drop(self.in_dir)
            s = self.read_cat(self.files)
            cold["read_cat"] = {"s": round(s, 3), "gbps": round(self.in_bytes / s / 1e9, 3)}
            self.log(f"  read cold cat: {s:.2f} s, {cold['read_cat']['gbps']:.2f} GB/s")
            self.drop(self.in_dir)
            out = a.dir / "out-cold"
            c = self.cli("pipelined_cold", self.in_dir, out, dev + a.extra)
            c["identical"] = c["ok"] and self.compare("cold == warm", self.digest(out), ref)
            cold["convert"] = c
            self.step("cold", cold)
            self.remove(out)
        shm = Path(a.shm)
        if shm.is_dir() and self.fits("tmpfs", 3 * t_pipe + 30):
            free = shutil.disk_usage(shm).free
            if free < 2.3 * self.in_bytes:
                self.log(f"skip tmpfs: {free / 1e9:.0f} GB free in {shm}")
                self.results["skipped"].append({"step": "tmpfs", "free_gb": round(free / 1e9, 1)})
            else:
                base = shm / "layoutc-bench"
                self.remove(base)
                t = time.perf_counter()
                shutil.copytree(self.in_dir, base / "in")
                tm = {"copy_s": round(time.perf_counter() - t, 2)}
                tm["read"] = self.reads("tmpfs", sorted((base / "in").glob("*.safetensors")), ("cat", "python"))
                c = self.cli("pipelined_tmpfs", base / "in", base / "out", dev + a.extra)
                c["identical"] = c["ok"] and self.compare("tmpfs == disk", self.digest(base / "out"), ref, other_input=True)
                tm["convert"] = c
                self.step("tmpfs", tm)
                self.remove(base)
        for pf, wr in ((4, 4), (1, 1)):
            if not self.fits(f"knobs_p{pf}_w{wr}", 1.5 * t_pipe + 15):
                break
            out = a.dir / f"out-p{pf}w{wr}"
            k = self.cli(f"pipelined_p{pf}_w{wr}", self.in_dir, out, dev + ["--prefetch", str(pf), "--writers", str(wr)])
            k["identical"] = k["ok"] and self.compare(f"p{pf}w{wr} == default", self.digest(out), ref)
            self.step(f"knobs_p{pf}_w{wr}", k)
            self.remove(out)

    def two(self) -> None:
        a = self.args
        ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.step("warm_read", self.reads("warm", self.files, ("cat", "python")))
        if a.device.startswith("cuda") and ngpu < 2:
            self.error("two", f"{ngpu} GPU(s): mode two needs 2")
            return
        dev = ["--device", "cuda"] if a.device.startswith("cuda") else ["--device", "cpu"]
        pairs = {}
        for label, extra in (("shards", []), ("tp2", ["-D", "tp_size=2"])):
            est = self.in_bytes / 1e9 / 0.5 + 30
            if not self.fits(f"{label}_one_rank", 2.5 * est):
                break
            one_dir, two_dir = a.dir / f"out-{label}-1", a.dir / f"out-{label}-2"
            r1 = self.cli(f"{label}_one_rank", self.in_dir, one_dir, dev + a.extra + extra)
            ref = self.digest(one_dir) if r1["ok"] else None
            self.remove(one_dir)
            if not self.fits(f"{label}_two_ranks", r1["wall_s"] + 20):
                self.step(f"{label}", {"one": r1})
                break
            r2 = self.cli(f"{label}_two_ranks", self.in_dir, two_dir, dev + a.extra + extra, ranks=2)
            same = r1["ok"] and r2["ok"] and self.compare(f"{label}: 2 ranks == 1 rank", self.digest(two_dir), ref)
            self.remove(two_dir)
            entry = {"one": r1, "two": r2, "identical": same}
            if r1["ok"] and r2["ok"]:
                entry["speedup_wall"] = round(r1["wall_s"] / r2["wall_s"], 3)
                entry["speedup_convert"] = round(r1["convert_s"] / r2["convert_s"], 3)
                self.log(f"  {label}: 2 ranks {entry['speedup_wall']:.2f}x wall, {entry['speedup_convert']:.2f}x in convert")
            pairs[label] = entry
            self.step(label, entry)
        self.results["summary"] = {k: {x: v.get(x) for x in ("speedup_wall", "speedup_convert", "identical")}
                                   for k, v in pairs.items()}
        shm = Path(a.shm)
        if "shards" in pairs and shm.is_dir() and self.fits("tmpfs", 3 * pairs["shards"]["one"]["wall_s"] + 30):
            free = shutil.disk_usage(shm).free
            if free >= 2.3 * self.in_bytes:
                base = shm / "layoutc-bench"
                self.remove(base)
                shutil.copytree(self.in_dir, base / "in")
                r1 = self.cli("tmpfs_one_rank", base / "in", base / "o1", dev + a.extra)
                self.remove(base / "o1")
                r2 = self.cli("tmpfs_two_ranks", base / "in", base / "o2", dev + a.extra, ranks=2)
                self.remove(base)
                entry = {"one": r1, "two": r2}
                if r1["ok"] and r2["ok"]:
                    entry["speedup_wall"] = round(r1["wall_s"] / r2["wall_s"], 3)
                    entry["speedup_convert"] = round(r1["convert_s"] / r2["convert_s"], 3)
                self.step("tmpfs", entry)
                self.results["summary"]["tmpfs"] = {x: entry.get(x) for x in ("speedup_wall", "speedup_convert")}

    def plain_copy(self, dest: Path) -> dict:
        """A plain copy of the same files on the same disk: ``shutil.copyfile`` (the kernel copies:
        copy_file_range / sendfile) of every shard and the index into ``dest``, each file fsynced,
        then the folder: what ``cp -r`` and ``sync`` do, with the durability a conversion gives."""
        self.remove(dest)
        t = time.perf_counter()
        dest.mkdir(parents=True)
        for src in [*self.files, self.in_dir / "model.safetensors.index.json"]:
            shutil.copyfile(src, dest / src.name)
            shardio.fsync_file(dest / src.name)
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        s = time.perf_counter() - t
        self.remove(dest)
        return {"name": "copy", "ok": True, "wall_s": round(s, 3), "gbps_wall": round(self.in_bytes / s / 1e9, 3)}

    def cache(self) -> str:
        """The input's page cache state before a step: ``cold`` drops its pages (posix_fadvise after an
        fsync: the next read goes to the disk, or to whatever caches the disk below this machine);
        ``warm`` reads every file once, so every step starts with the input in memory."""
        if self.args.cache == "cold":
            return "cold" if self.drop(self.in_dir) else "unknown (posix_fadvise failed)"
        self.read_cat(self.files)
        return "warm"

    def ab(self) -> None:
        """Before (``--old``, another checkout) and after (this tree), and a plain copy of the same files,
        in alternation, ``--rounds`` times (the order rotates each round): the three see the same load
        and disk, so their ratios hold on a machine others use. Round 1 compares every output file."""
        a = self.args
        old = Path(a.old).resolve() if a.old else None
        dev = ["--device", a.device, "-q"]
        steps = ["copy", "new"] + (["old"] if old else [])
        rounds, ref = [], {}
        for r in range(a.rounds):
            order = steps[r % len(steps):] + steps[:r % len(steps)]
            row = {"round": r + 1, "order": order, "load_before": os.getloadavg()}
            for step in order:
                if not self.fits(f"round{r + 1}_{step}", 60 + self.in_bytes / 1e9 / 0.05):
                    break
                state = self.cache()
                out = a.dir / f"out-{step}"
                if step == "copy":
                    res = self.plain_copy(out)
                else:
                    res = self.cli(f"r{r + 1}_{step}", self.in_dir, out, dev + a.extra,
                                   tree=old if step == "old" else ROOT)
                    if res["ok"] and r == 0:
                        ref[step] = self.digest(out)
                    self.remove(out)
                res["cache"] = state
                row[step] = res
                self.log(f"  round {r + 1} {step} ({state}): {res['wall_s']:.2f} s whole"
                         + (f", {res['convert_s']:.2f} s in convert, process CPU {res.get('process_cpu_s')} s"
                            if "convert_s" in res else ""))
            row["load_after"] = os.getloadavg()
            rounds.append(row)
            self.step("rounds", rounds)
        if "old" in ref and "new" in ref:
            self.results["identical_old_new"] = self.compare("old == new (round 1)", ref["new"], ref["old"])
        self.results["summary"] = summary = {"cache": a.cache, "rounds": len(rounds)}

        def med(xs):
            xs = sorted(xs)
            return round(xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2, 3)

        for step in ("old", "new"):
            ok = [row for row in rounds if row.get(step, {}).get("ok") and "copy" in row]
            if not ok:
                continue
            summary[step] = {
                "whole_gbps": med([row[step]["gbps_wall"] for row in ok]),
                "convert_gbps": med([row[step]["gbps_convert"] for row in ok]),
                "copy_gbps": med([row["copy"]["gbps_wall"] for row in ok]),
                "whole_vs_copy": med([row["copy"]["wall_s"] / row[step]["wall_s"] for row in ok]),
                "convert_vs_copy": med([row["copy"]["wall_s"] / row[step]["convert_s"] for row in ok]),
                "process_cpu_s": med([row[step].get("process_cpu_s") or 0 for row in ok]),
                "whole_cpu_s": med([row[step].get("whole_cpu_s") or 0 for row in ok]),
            }
        self.save()

    # -- report --------------------------------------------------------------------------------

    def table(self) -> None:
        s = self.results["steps"]
        lines = [f"== checkpoint throughput ({self.args.mode}): {self.in_bytes / 1e9:.2f} GB, "
                 f"{len(self.files)} shards, dims {self.dims}, {self.layers} MoE layers =="]
        for k in ("warm_read",):
            if k in s:
                lines.append("read warm:  " + ", ".join(f"{h} {v['gbps']:.2f} GB/s" for h, v in s[k].items())
                             + (f" | copy (read+write+fsync) {s['warm_copy']['gbps']:.2f} GB/s" if "warm_copy" in s else ""))
        for k, v in s.items():
            runs = []
            if isinstance(v, dict) and "wall_s" in v:
                runs = [(k, v)]
            elif isinstance(v, dict):
                runs = [(f"{k}.{kk}", vv) for kk, vv in v.items() if isinstance(vv, dict) and "wall_s" in vv]
            for name, r in runs:
                if r.get("ok"):
                    lines.append(f"{name:<32} {r['wall_s']:7.1f} s wall {r['gbps_wall']:6.2f} GB/s | in convert "
                                 f"{r['convert_s']:6.1f} s {r['gbps_convert']:6.2f} GB/s"
                                 + (f" | identical={r['identical']}" if "identical" in r else "")
                                 + (f" | identical={r['identical_to_pipelined']}" if "identical_to_pipelined" in r else ""))
                else:
                    lines.append(f"{name:<32} FAILED (rc {r.get('rc')})")
        for row in s.get("rounds", []):
            parts = []
            for step in row["order"]:
                r = row.get(step)
                if r is None:
                    continue
                if not r.get("ok"):
                    parts.append(f"{step} FAILED")
                    continue
                parts.append(f"{step} {r['wall_s']:.1f} s" + (
                    f" (in convert {r['convert_s']:.1f} s, CPU in convert {r.get('process_cpu_s')} s, "
                    f"whole {r.get('whole_cpu_s')} s)" if "convert_s" in r else ""))
            lines.append(f"round {row['round']} ({row.get('new', row.get('copy', {})).get('cache')}; load "
                         f"{row['load_before'][0]:.1f} -> {row['load_after'][0]:.1f}): " + ", ".join(parts))
        main = s.get("convert_pipelined_warm") or (s.get("shards") or {}).get("one")
        if main and main.get("ok") and main.get("profiles"):
            p = main["profiles"][0]
            wall = p["wall_s"]
            lines.append(f"stages of {main.get('name', 'the main run')} (seconds over all threads, % of its "
                         f"{wall:.1f} s): " + ", ".join(
                             f"{k} {v:.1f} ({100 * v / wall:.0f}%)" for k, v in
                             sorted(p["stages"].items(), key=lambda kv: -kv[1]) if k != "wall" and v >= 0.01 * wall))
        if "summary" in self.results:
            lines.append(f"summary: {json.dumps(self.results['summary'])}")
        if self.results["skipped"]:
            lines.append("skipped: " + ", ".join(x["step"] for x in self.results["skipped"]))
        if self.results["errors"]:
            lines.append(f"ERRORS: {len(self.results['errors'])} (see the JSON)")
        for ln in lines:
            self.log(ln)
        self.results["table"] = lines
        self.save()


def _mount_of(path: Path) -> str:
    try:
        path = path.resolve()
        best = ("", "?", "?")
        for ln in open("/proc/mounts"):
            dev, mnt, fs = ln.split()[:3]
            if (str(path) + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best[0]):
                best = (mnt, fs, dev)
        return f"{best[1]} on {best[0]} ({best[2]})"
    except OSError:
        return "?"


def _dims(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}


def _defines(items: list[str]) -> dict:
    out = {}
    for kv in items:
        k, v = kv.split("=", 1)
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


DIR_MARKER = ".checkpoint-throughput-dir"  # in a --dir this benchmark made, so may delete


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["one", "two", "ab"])
    ap.add_argument("--size-gb", type=float, default=16.0, help="checkpoint size (default 16)")
    ap.add_argument("--shard-gb", type=float, default=None, help="shard size (default min(2, size/8))")
    ap.add_argument("--dims", default=",".join(f"{k}={v}" for k, v in GPT_OSS_120B.items()),
                    help="MoE dims (fewer experts when the size is small)")
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("-D", "--define", action="append", default=[], help="spec parameter for every run")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench-ckpt", help="where the checkpoint goes (a disk)")
    ap.add_argument("--shm", default="/dev/shm", help="a tmpfs for the no-disk runs")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "out")), help="results folder")
    ap.add_argument("--budget-s", type=float, default=300.0, help="start no step that would end past this")
    ap.add_argument("--hard-s", type=float, default=540.0, help="kill a conversion still running at this time")
    ap.add_argument("--extra", default="", help="more `layoutc convert` options for the pipelined runs")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    ap.add_argument("--old", default=None, help="ab: another checkout (its folder holds layoutc/) run as 'before'")
    ap.add_argument("--rounds", type=int, default=3, help="ab: rounds of copy, after and before in alternation")
    ap.add_argument("--cache", choices=["cold", "warm"], default="cold",
                    help="ab: the input's page cache before every step (cold: its pages dropped; warm: read once)")
    ap.add_argument("--no-smoke", action="store_true", help="skip the small in-process check before the runs")
    args = ap.parse_args()
    args.extra = args.extra.split()
    args.dir = args.dir.resolve()
    # The benchmark deletes its folders in --dir (and --dir itself unless --keep): only in a folder it
    # made, marked so, never in a folder of the user's given by mistake (--dir ~ would delete home).
    marker = args.dir / DIR_MARKER
    if args.dir.exists() and any(args.dir.iterdir()) and not marker.is_file():
        print(f"--dir {args.dir} is not empty and was not made by this benchmark (no {DIR_MARKER}); "
              f"give a new or empty folder", file=sys.stderr)
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    marker.touch()
    b = Bench(args)
    try:
        b.environment()
        if args.device.startswith("cuda"):
            b.micro()
        b.generate()
        if not args.no_smoke:
            b.smoke()
        {"one": b.one, "two": b.two, "ab": b.ab}[args.mode]()
    except Exception as err:  # noqa: BLE001 -- keep what was measured
        import traceback

        b.error("main", traceback.format_exc())
        del err
    finally:
        if hasattr(b, "in_bytes"):
            b.table()
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
        b.save()
    return 1 if b.results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
