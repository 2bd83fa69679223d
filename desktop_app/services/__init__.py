"""The app's links to the world outside the GUI: the engine and the Hugging Face hub.

`engine_bridge` is the one QObject between the GUI and the loaded model's worker (a
`worker_protocol.ModelWorker`: `local_worker`'s over `engine.EngineWorker`, or `remote`'s
on a server); `downloads` fetches models from the hub (no Qt, run on a plain thread by the
model manager).
"""
