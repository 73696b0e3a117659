"""The `vllm.general_plugins` entry point of the wsync package: makes
"wsync" a weight-transfer backend of every vLLM process (engine core and
workers), worker side and trainer side. Registration is by module path, so
wsync.vllm (and wsync's extension) is imported only where vLLM creates the
backend. vLLM may call this more than once in a process."""


def register():
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    for factory, cls in ((WeightTransferEngineFactory, "WsyncWeightTransferEngine"),
                         (WeightTransferTrainerFactory, "WsyncTrainerWeightTransferEngine")):
        try:
            factory.register_engine("wsync", "wsync.vllm", cls)
        except ValueError:
            pass  # registered by an earlier call in this process
