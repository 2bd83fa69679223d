"""The ``folio`` command: ``folio chat``, ``folio serve``, ``folio models``, ``folio bench``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from engine.startup import freeze_imports, pause_collection, resume_collection
from engine.terminal_chat import HELP, TerminalChat, attach_files, format_kv_stats
from engine.text.reasoning.options import REASONING_EFFORTS

__all__ = ["TerminalChat", "attach_files", "engine_config", "format_kv_stats", "main"]

def _progress(stage: str, fraction: float) -> None:
    print(f"\r[{fraction:4.0%}] {stage:<40}", end="" if fraction < 1 else "\n", file=sys.stderr)


def engine_config(args):
    """The EngineConfig of `--device` / `--weights` / `--cpu-activation-bits` /
    `--kv-cache-dtype` / `--kv-disk-gib` / `--speculative` / `--num-speculative-tokens` /
    `--embedding-model` / `--mmproj` / `--vision-dtype` (the rest stays at its
    defaults)."""
    from engine.config import EngineConfig

    return EngineConfig(device=args.device, weights=args.weights,
                        cpu_activation_bits=args.cpu_activation_bits,
                        kv_cache_dtype=args.kv_cache_dtype,
                        kv_disk_bytes=int(args.kv_disk_gib * (1 << 30)),
                        speculative=args.speculative,
                        num_speculative_tokens=args.num_speculative_tokens,
                        embedding_model=getattr(args, "embedding_model", None),
                        mmproj=getattr(args, "mmproj", None),
                        vision_dtype=getattr(args, "vision_dtype", None))


def cmd_chat(args, read_line: Callable[[str], str] = input) -> int:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    freeze_imports()
    llm = LLM(args.model, engine_config(args), progress=_progress)
    resume_collection()
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            seed=args.seed)
    try:
        files = attach_files(llm, args.file)
        chat = TerminalChat(llm, params, reasoning_effort=args.reasoning_effort, files=files)
        for path in args.image:
            chat.attach(path)
    except (OSError, ValueError) as exc:
        llm.close()
        print(f"folio chat: error: {exc}", file=sys.stderr)
        return 2
    print(f"Chatting with {llm.model_name}. {HELP}")
    try:
        while True:
            try:
                line = read_line("> ")
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            try:
                if not chat.handle(line):
                    return 0
            except ValueError as exc:
                print(f"error: {exc}")
    finally:
        llm.close()  # with --kv-disk-gib, the chat's blocks stay on disk


def cmd_serve(args) -> int:
    """Every model of the library (`folio models` with the same --models-dir) answers by
    name, loaded on demand within the memory budget; --model is loaded at start."""
    from engine.hosting.library import UnknownModel
    from engine.serve.app import ServeSettings
    from engine.serve.hosted import HostedServe
    from engine.serve.server import check_host, check_port_free, serve_forever

    freeze_imports()
    try:  # before minutes of loading, not after
        check_host(args.host, args.api_key)
        check_port_free(args.port, args.host)
        settings = ServeSettings(api_key=args.api_key, allowed_hosts=args.allowed_hosts,
                                 allowed_origins=args.allowed_origins,
                                 allow_image_urls=args.allow_image_urls,
                                 embedding_model=args.embedding_model,
                                 **({} if args.limit_concurrency is None else
                                    {"limit_concurrency": args.limit_concurrency}))
        settings.embedder()  # loaded (once) before the chat model: a bad path fails fast
        hosted = HostedServe(args.model, args.models_dir, args.keep_alive, args.memory_gib,
                             engine_config(args))
    except (ValueError, OSError, UnknownModel) as exc:
        print(f"folio serve: error: {exc}", file=sys.stderr)
        return 2
    for problem in hosted.library.problems:
        print(f"folio serve: skipped {problem.path}: {problem.error}", file=sys.stderr)
    print(f"Loading {hosted.name} ...", file=sys.stderr)
    models = hosted.start()
    resume_collection()
    print(f"Serving {len(hosted.library.names())} models ({hosted.name} loaded; memory "
          f"budget {hosted.budget_gib:.1f} GiB) at http://{args.host}:{args.port}/v1 "
          f"(OpenAI API; Ctrl+C stops)", file=sys.stderr)
    try:
        serve_forever(models, args.host, args.port, settings)
    finally:
        hosted.stop()
    return 0


def cmd_models(args) -> int:
    from engine.hosting.library import models_in
    from engine.loaders.catalog import list_local_models

    paths = list(args.path)
    for folder in args.models_dir:
        if not Path(folder).expanduser().is_dir():
            print(f"folio models: error: --models-dir {folder} is not a folder",
                  file=sys.stderr)
            return 2
        paths += models_in(Path(folder).expanduser())
    for info in list_local_models(paths):
        params = f"{info.num_parameters / 1e6:.0f}M" if info.num_parameters else "?"
        if info.active_parameters is not None:  # a mixture of experts
            params += f" ({info.active_parameters / 1e6:.0f}M active)"
        print(f"{info.name:<40} {info.format:<5} {info.architecture or '?':<22} {params:>6} "
              f"ctx {info.context_length or '?':<6} {info.size_bytes / 2**20:8.0f} MiB  "
              f"{info.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs a subcommand; a model that cannot be found or loaded, or an engine setting
    that cannot run here (`--device cuda:3`, a KV budget too small), ends it with the
    message on stderr and exit status 2, not a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["chat"], ["serve"]):
        pause_collection()  # until the first model has loaded (engine/startup.py)
    try:
        return _run_command(argv)
    except ValueError as exc:
        from engine.loaders.base import FolioLoadError  # imports torch: not before the pause

        # Settings errors name their field ("EngineConfig.device must be ..."); any other
        # ValueError is a bug and keeps its traceback.
        if not isinstance(exc, FolioLoadError) and not str(exc).startswith("EngineConfig."):
            raise
        print(f"folio: error: {exc}", file=sys.stderr)
        return 2
    finally:
        resume_collection()


def _engine_options(parser: argparse.ArgumentParser) -> None:
    from engine.config import DEFAULT_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS, WEIGHTS
    from engine.dtypes import KV_DTYPE_NAMES

    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:N or mps (default: CUDA when available)")
    parser.add_argument("--weights", default="stored", choices=WEIGHTS,
                        help="stored: quantized GGUF weights stay quantized; bfloat16 or "
                        "float32: dense weights in that dtype (float32 is the exact path)")
    parser.add_argument("--cpu-activation-bits", type=int, default=16, choices=(8, 16),
                        help="quantized products on the CPU at decode sizes: 16 keeps the "
                        "float32 path's tokens; 8 (as llama.cpp) decodes 10-20%% faster")
    parser.add_argument("--kv-cache-dtype", default=None, choices=KV_DTYPE_NAMES,
                        help="the KV cache's dtype: int8 and fp8 (8-bit) take about half "
                        "float16's memory per token, int4 about a quarter (default: "
                        "int8 on the native CPU kernels, else the compute dtype)")
    parser.add_argument("--kv-disk-gib", type=float, default=0.0, metavar="GIB",
                        help="keep KV cache blocks leaving memory on disk, up to this many "
                        "GiB, so prompts seen before (a restart too) are not recomputed "
                        "(default 0: off)")
    parser.add_argument("--speculative", default=None, metavar="ngram|draft:PATH|mtp",
                        help="speculative decoding for every reply, checked in one step "
                        "and the reply the same: ngram drafts what the reply is about to "
                        "copy from the chat (code to edit, quoted text); draft:PATH lets a "
                        "small model with the same vocabulary (a folder, a .gguf file or "
                        "starter) draft every token; mtp lets the model's own "
                        "multi-token-prediction head draft (Qwen3.5 folders that ship one) "
                        "(default: off; a request's prediction still drafts)")
    parser.add_argument("--num-speculative-tokens", type=int,
                        default=DEFAULT_SPECULATIVE_TOKENS, metavar="K",
                        help=f"the most drafts checked in one step, 1 to "
                        f"{MAX_SPECULATIVE_TOKENS} (default {DEFAULT_SPECULATIVE_TOKENS}); "
                        "fewer while drafts are rejected")
    parser.add_argument("--embedding-model", default=None, metavar="PATH",
                        help="an embedding model (a folder or .gguf file: bge, "
                        "nomic-embed-text, Qwen3-Embedding) that ranks a long document's "
                        "passages beside BM25; folio serve answers /v1/embeddings with it "
                        "(default: none, BM25 alone)")
    parser.add_argument("--mmproj", default=None, metavar="PATH",
                        help="the vision projector (llama.cpp's mmproj .gguf) of a .gguf "
                        "--model, so that it sees images (default: the .gguf file beside "
                        "the model whose name holds 'mmproj', the first by name)")
    parser.add_argument("--vision-dtype", default=None, choices=("float32", "bfloat16"),
                        help="the vision tower's compute dtype (default: the model's, or "
                        "bfloat16 for Qwen3.5's tower on a CPU with AMX or AVX512-BF16; "
                        "float32 is the exact path)")


def _run_command(argv: list[str]) -> int:
    if argv[:1] == ["bench"]:
        from engine.bench.cli import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="folio", description="Folio: chat with local LLMs")
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="chat in the terminal")
    chat.add_argument("--model", default="starter", help="'starter', a folder or a .gguf file")
    chat.add_argument("--temperature", type=float, default=0.7)
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--image", action="append", default=[], metavar="PATH",
                      help="attach an image to the first message (repeatable; a model "
                           "that sees images: engine/vision); /image PATH attaches later")
    chat.add_argument("--reasoning-effort", default=None, choices=REASONING_EFFORTS,
                      help="how hard a reasoning model thinks, for templates that read it "
                           "(gpt-oss); default: the template's own")
    chat.add_argument("--file", action="append", default=[], metavar="PATH",
                      help="attach a PDF, DOCX, Markdown, HTML, text or code file to the "
                      "chat's first question (repeatable); a file that fits is kept warm")
    _engine_options(chat)
    serve = sub.add_parser("serve", help="an OpenAI-compatible API on this machine")
    serve.add_argument("--model", default="starter",
                       help="the model loaded at start: a name `folio models` lists, a "
                       "folder or a .gguf file (every listed model answers by name)")
    serve.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                       help="serve the .gguf files and model folders in DIR too, beside the "
                       "starter and the Hugging Face cache (repeatable; folders added in the "
                       "app are passed this way)")
    serve.add_argument("--keep-alive", default="5m", metavar="DURATION",
                       help="how long a model stays loaded after its last request, as "
                       "Ollama's keep_alive: seconds or 30s/5m/1h, 0 unloads at once, "
                       "negative keeps it (default 5m; a request's keep_alive overrides it)")
    serve.add_argument("--memory-gib", type=float, default=None, metavar="GIB",
                       help="the memory the loaded models may take, weights and KV pools "
                       "together; the least recently used idle model is unloaded to make "
                       "room (default: 75%% of the machine's memory, the card's on CUDA)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None,
                       help="clients must send 'Authorization: Bearer KEY'; required "
                       "for a host other than loopback")
    serve.add_argument("--allowed-hosts", default="", metavar="NAMES",
                       help="comma-separated names clients may reach the server by, beyond "
                       "localhost, 127.0.0.1, [::1] and --host (other Host headers get "
                       "403, against DNS rebinding), e.g. box.local")
    serve.add_argument("--allowed-origins", default="", metavar="ORIGINS",
                       help="comma-separated browser origins allowed to call the API, with "
                       "CORS headers (default: none), e.g. http://localhost:3000 or "
                       "http://localhost:*")
    serve.add_argument("--allow-image-urls", action="store_true",
                       help="fetch http(s) image URLs in requests (off: data: URLs only; "
                            "a server that fetches any URL it is handed can be made to "
                            "reach your own network)")
    serve.add_argument("--limit-concurrency", type=int, default=None, metavar="N",
                       help="open connections (idle ones too) past which a request gets "
                       "503 (default: 256)")
    _engine_options(serve)
    models = sub.add_parser("models", help="list local models")
    models.add_argument("path", nargs="*", help="extra folders or .gguf files")
    models.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                        help="the .gguf files and model folders in DIR too (repeatable), "
                        "as folio serve --models-dir lists them")
    sub.add_parser("bench", help="benchmarks: folio bench WORKLOAD --help")
    args = parser.parse_args(argv)
    if args.command == "chat":
        return cmd_chat(args)
    if args.command == "serve":
        return cmd_serve(args)
    return cmd_models(args)


if __name__ == "__main__":
    sys.exit(main())
