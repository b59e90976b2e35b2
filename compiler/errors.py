"""Typed compiler errors; each carries the evidence a user needs to act on it.

Every error has a `stage` (one of STAGES) and `evidence()` -> a JSON-safe dict. The CLI renders
these; library code never prints.
"""
from __future__ import annotations

from typing import Optional

# Where a compiled program can break, in pipeline order. cli/console.py maps each to an exit code.
STAGES = ("dynamo", "aot_autograd", "lowering", "scheduling", "cpp_build", "kernel_runtime",
          "accuracy", "crash", "timeout")


class TdbgError(Exception):
    stage = "internal"

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": str(self)}


class LoweringError(TdbgError):
    """An FX node could not be lowered (and could not fall back)."""
    stage = "lowering"

    def __init__(self, message: str, *, node: str = "", target: str = "",
                 inputs: Optional[list] = None, debug_dir: Optional[str] = None, source: str = ""):
        super().__init__(f"{message}\n  FX node: {node}\n  target: {target}\n  inputs: {inputs or []}")
        self.node, self.target, self.inputs, self.debug_dir = node, target, inputs or [], debug_dir
        self.short, self.source = message, source

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": self.short, "fx_node": self.node,
                "target": self.target, "inputs": self.inputs, "debug_dir": self.debug_dir,
                "source": self.source}


class IRInvariantError(TdbgError):
    """A check between pipeline stages failed: a compiler bug, named by stage and node."""
    stage = "scheduling"

    def __init__(self, message: str, *, after_stage: str, node: str = ""):
        super().__init__(f"IR invariant broken after {after_stage}: {message} (node {node})")
        self.after_stage, self.node = after_stage, node

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": str(self), "after_stage": self.after_stage, "node": self.node}


def trim_compiler_output(stderr: str, max_errors: int = 3, max_lines: int = 30) -> str:
    """Keep the first few `error:` diagnostics with their context lines."""
    lines = stderr.splitlines()
    kept, errors = [], 0
    for line in lines:
        if "error:" in line:
            errors += 1
            if errors > max_errors:
                break
        kept.append(line)
        if len(kept) >= max_lines:
            break
    if len(kept) < len(lines):
        kept.append(f"... ({len(lines) - len(kept)} more lines)")
    return "\n".join(kept)


class CppCompileError(TdbgError):
    """g++ rejected generated code."""
    stage = "cpp_build"

    def __init__(self, *, command: list, stderr: str, source_path: str, kernels: tuple = (),
                 fx_nodes: tuple = ()):
        self.command, self.source_path, self.kernels = list(command), source_path, tuple(kernels)
        self.fx_nodes = tuple(fx_nodes)
        self.node_source = ""    # the first failing FX node's stack trace (set by compile_aten)
        self.full_stderr = stderr
        self.stderr = trim_compiler_output(stderr)
        super().__init__(f"C++ compile failed for {source_path}\n$ {' '.join(self.command)}\n{self.stderr}")

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": self.stderr, "command": self.command,
                "source_path": self.source_path, "kernel": ", ".join(self.kernels),
                "fx_nodes": list(self.fx_nodes), "node_source": self.node_source}


class KernelRuntimeError(TdbgError):
    """A generated kernel reported an error while running."""
    stage = "kernel_runtime"

    def __init__(self, message: str, *, kernel: str, fx_nodes: tuple = (), source: str = ""):
        super().__init__(f"{message} (kernel {kernel})")
        self.kernel, self.fx_nodes, self.short, self.source = kernel, tuple(fx_nodes), message, source
        self.node_source = ""    # the FX node's stack trace (set by CompiledGraph when it has one)

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": self.short, "kernel": self.kernel,
                "fx_nodes": list(self.fx_nodes), "source": self.source, "node_source": self.node_source}


class CacheDirError(TdbgError):
    """The kernel cache directory (config.cache_dir, set by TDBG_CACHE_DIR) cannot be used: it
    cannot be created or written, or it is not private and not ours to fix. Bad input, not a
    compiler bug: `stage` is the CLI's "bad_input" cause."""
    stage = "bad_input"
    variable = "TDBG_CACHE_DIR"

    def __init__(self, cache_dir: str, path: str, reason: str):
        """`reason` reads after the path: "is not writable: ...", "is mode 0755 and ..."."""
        self.cache_dir, self.path, self.reason = cache_dir, path, reason
        where = "" if path == cache_dir else f" ({path} inside it)"
        super().__init__(f"{self.variable}={cache_dir}{where} {reason}; tdbg's compiler keeps its built "
                         f"kernels there. Point {self.variable} at a folder this user can write.")

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": str(self), "variable": self.variable,
                "cache_dir": self.cache_dir, "path": self.path, "reason": self.reason}
