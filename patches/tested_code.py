"""The AST fingerprint of each patch's targets on each release it was tested on (None: the
target is absent there), and the digest of their modules' text on each (SOURCES). Generated
by `make upstream-release-record` from the releases' sdists; tests/patches/test_releases.py
checks it. Do not edit."""

TESTED: dict[str, dict[str, dict[str, str | None]]] = {
    "cpu-accelerator-api": {
        "0.27.1": {
            "torch._dynamo.variables.torch:handle_synchronize": "5e0ba90e865b898d",
        },
        "0.32.0": {
            "torch._dynamo.variables.torch:handle_synchronize": "5e0ba90e865b898d",
        },
    },
    "cpu-accelerator-noops": {
        "0.27.1": {
            "vllm.v1.worker.cpu.shm": "2536545001fc9df0",
            "vllm.v1.worker.cpu_model_runner:_set_torch_accelerator_to_noop": "54a639358a812a97",
        },
        "0.32.0": {
            "vllm.v1.worker.cpu.shm": "1701d4dbf1c47660",
            "vllm.v1.worker.cpu_model_runner:_set_torch_accelerator_to_noop": "3d0d0bd47df43d0f",
        },
    },
    "xpu-shutdown": {
        "0.24.0": {
            "vllm.platforms.xpu:XPUPlatform.check_and_update_config": "a54c96b947e79eb1",
            "vllm.v1.worker.xpu_worker:XPUWorker.shutdown": None,
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner.shutdown": "ab2e7f47c5ba3a65",
            "vllm.v1.worker.gpu.model_runner:GPUModelRunner.shutdown": "6430a80c578ec3d3",
            "vllm.v1.worker.gpu_worker:Worker.shutdown": "d0bdcfa9abcb6021",
            "vllm.device_allocator.xpumem:XpuMemAllocator.release_pools": "d058d31ab8062c71",
        },
        "0.27.1": {
            "vllm.platforms.xpu:XPUPlatform.check_and_update_config": "0a4013f3610ae20b",
            "vllm.v1.worker.xpu_worker:XPUWorker.shutdown": "a4143b2e6051663a",
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner.shutdown": "c476a96f6f8dcc1c",
            "vllm.v1.worker.gpu.model_runner:GPUModelRunner.shutdown": "b96071eafba41fbe",
            "vllm.v1.worker.gpu_worker:Worker.shutdown": "f15727e30367e556",
            "vllm.device_allocator.xpumem:XpuMemAllocator.release_pools": "d058d31ab8062c71",
        },
        "0.32.0": {
            "vllm.platforms.xpu:XPUPlatform.check_and_update_config": "148db64801d92d3b",
            "vllm.v1.worker.xpu_worker:XPUWorker.shutdown": "a4143b2e6051663a",
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner.shutdown": "c476a96f6f8dcc1c",
            "vllm.v1.worker.gpu.model_runner:GPUModelRunner.shutdown": "a6c0f770c56748ef",
            "vllm.v1.worker.gpu_worker:Worker.shutdown": "d3a4689c978eced5",
            "vllm.device_allocator.xpumem:XpuMemAllocator.release_pools": "7953cde2732a1b6c",
        },
    },
    "drain-deadline": {
        "0.27.1": {
            "vllm.v1.engine.core:EngineCoreProc._handle_shutdown": "d59a42752a83f421",
            "vllm.v1.engine.core:EngineCoreProc._send_abort_outputs": "a52844cb259f76d1",
            "vllm.v1.engine.async_llm:AsyncLLM.shutdown": "df5872c1b4c35b10",
            "vllm.v1.engine.output_processor:OutputProcessor.propagate_error": "4b92a08eb329f844",
            "vllm.v1.engine.output_processor:OutputProcessor.has_unfinished_requests": "c9534557d862841b",
            "vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished": "4604a21811e57a9f",
            "vllm.v1.engine.output_processor:OutputProcessor.abort_requests": "90899f2e365b7889",
            "vllm.v1.engine.core:EngineShutdownState": "92e3b35d6e0f3952",
            "vllm.v1.core.sched.scheduler:Scheduler.get_num_unfinished_requests": "e8a2dd0694a5c5dc",
            "vllm.v1.request:RequestStatus": "7c545a6dd84ab146",
            "vllm.v1.engine:FinishReason": "bae33f437e4507a1",
        },
        "0.32.0": {
            "vllm.v1.engine.core:EngineCoreProc._handle_shutdown": "d59a42752a83f421",
            "vllm.v1.engine.core:EngineCoreProc._send_abort_outputs": "a52844cb259f76d1",
            "vllm.v1.engine.async_llm:AsyncLLM.shutdown": "df5872c1b4c35b10",
            "vllm.v1.engine.output_processor:OutputProcessor.propagate_error": "4b92a08eb329f844",
            "vllm.v1.engine.output_processor:OutputProcessor.has_unfinished_requests": "c9534557d862841b",
            "vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished": "4604a21811e57a9f",
            "vllm.v1.engine.output_processor:OutputProcessor.abort_requests": "9e0c095491beb77f",
            "vllm.v1.engine.core:EngineShutdownState": "92e3b35d6e0f3952",
            "vllm.v1.core.sched.scheduler:Scheduler.get_num_unfinished_requests": "0a0d599df2a147c5",
            "vllm.v1.request:RequestStatus": "7c545a6dd84ab146",
            "vllm.v1.engine:FinishReason": "0fa7d47887f9d240",
        },
    },
    "fast-exit": {
        "0.27.1": {
            "vllm.v1.engine.core:EngineCoreProc.run_engine_core": "00c90a546f672212",
            "vllm.v1.engine.core:EngineCore.shutdown": "c9d9fd6b99e24117",
            "vllm.v1.executor.multiproc_executor:WorkerProc.shutdown": "8612bcf4eec760a5",
        },
        "0.32.0": {
            "vllm.v1.engine.core:EngineCoreProc.run_engine_core": "11eb5f0b0cece8d0",
            "vllm.v1.engine.core:EngineCore.shutdown": "c9d9fd6b99e24117",
            "vllm.v1.executor.multiproc_executor:WorkerProc.shutdown": "8612bcf4eec760a5",
        },
    },
    "cpu-aot-compile": {
        "0.27.1": {
            "vllm.envs:use_aot_compile": "03bb42c7ad2cead2",
        },
        "0.32.0": {
            "vllm.envs:use_aot_compile": "03bb42c7ad2cead2",
        },
        "0.33.0": {
            "vllm.envs:use_aot_compile": "24bdb7b14013769a",
        },
        "0.34.0": {
            "vllm.envs:use_aot_compile": "24bdb7b14013769a",
        },
    },
    "shm-busy-sleep": {
        "0.27.1": {
            "vllm.distributed.device_communicators.shm_broadcast:SpinCondition": "fd9ba634a9c35b48",
        },
        "0.32.0": {
            "vllm.distributed.device_communicators.shm_broadcast:SpinCondition": "fc89baeffc89ca9f",
        },
        "0.33.0": {
            "vllm.distributed.device_communicators.shm_broadcast:SpinCondition": "48f29ce0e38ad94d",
        },
        "0.34.0": {
            "vllm.distributed.device_communicators.shm_broadcast:SpinCondition": "48f29ce0e38ad94d",
        },
    },
    "engine-parent-watch": {
        "0.27.1": {
            "vllm.v1.engine.core:EngineCoreProc.run_engine_core": "00c90a546f672212",
            "vllm.v1.engine.core:EngineCoreProc._handle_shutdown": "d59a42752a83f421",
            "vllm.v1.engine.core:EngineShutdownState": "92e3b35d6e0f3952",
        },
        "0.32.0": {
            "vllm.v1.engine.core:EngineCoreProc.run_engine_core": "11eb5f0b0cece8d0",
            "vllm.v1.engine.core:EngineCoreProc._handle_shutdown": "d59a42752a83f421",
            "vllm.v1.engine.core:EngineShutdownState": "92e3b35d6e0f3952",
        },
    },
    "cpu-amx-tiles": {
        "0.27.1": {
            "vllm.v1.attention.backends.cpu_attn:_get_attn_isa": "5ed81eb564c49091",
        },
        "0.32.0": {
            "vllm.v1.attention.backends.cpu_attn:_get_attn_isa": "8f1cbc670bcdbbfb",
        },
    },
}

SOURCES: dict[str, dict[str, str | None]] = {
    "0.24.0": {
        "vllm.device_allocator.xpumem": "4b07b2e1bd6ddd72",
        "vllm.platforms.xpu": "1c01412a8aaf1a86",
        "vllm.v1.worker.gpu.model_runner": "efeb3174669468f8",
        "vllm.v1.worker.gpu_model_runner": "d2b8ec101122749e",
        "vllm.v1.worker.gpu_worker": "271c3e2eaab7f1ca",
        "vllm.v1.worker.xpu_worker": "63cfa1e3808681d5",
    },
    "0.27.1": {
        "torch._dynamo.variables.torch": "c3fe24ef66635cbb",
        "vllm.device_allocator.xpumem": "4b07b2e1bd6ddd72",
        "vllm.distributed.device_communicators.shm_broadcast": "a78bbfb8f7508120",
        "vllm.envs": "567c99293678739c",
        "vllm.platforms.xpu": "967bcbd6b3781627",
        "vllm.v1.attention.backends.cpu_attn": "d9bd9cd166714f9c",
        "vllm.v1.core.sched.scheduler": "c67bda2886b52865",
        "vllm.v1.engine": "fb7f8a1b1a1f9ce4",
        "vllm.v1.engine.async_llm": "81a0cae6d5da2214",
        "vllm.v1.engine.core": "6fdd067f54e5d42c",
        "vllm.v1.engine.output_processor": "7cd99f14e0c0dc5f",
        "vllm.v1.executor.multiproc_executor": "ceb3477473bdb1de",
        "vllm.v1.request": "6085b0668f41d56c",
        "vllm.v1.worker.cpu.shm": "b0a37eff5ba7f309",
        "vllm.v1.worker.cpu_model_runner": "c4902ad8dc20c14b",
        "vllm.v1.worker.gpu.model_runner": "60fb531a045d6879",
        "vllm.v1.worker.gpu_model_runner": "993f2c926012241b",
        "vllm.v1.worker.gpu_worker": "50134ca3a147f547",
        "vllm.v1.worker.xpu_worker": "bd3b35ad0e5ce233",
    },
    "0.32.0": {
        "torch._dynamo.variables.torch": "c3fe24ef66635cbb",
        "vllm.device_allocator.xpumem": "4415f2f62fc02710",
        "vllm.distributed.device_communicators.shm_broadcast": "8b122fa8a8ae05a4",
        "vllm.envs": "e963af06cf6c775f",
        "vllm.platforms.xpu": "097b700117ae487e",
        "vllm.v1.attention.backends.cpu_attn": "ffcb1e2b03ceb1d9",
        "vllm.v1.core.sched.scheduler": "d9a39870286c424c",
        "vllm.v1.engine": "5a525d4fc6e9a802",
        "vllm.v1.engine.async_llm": "3491dde64ef226b9",
        "vllm.v1.engine.core": "458fd729771681b1",
        "vllm.v1.engine.output_processor": "e78c5af6b0db10c9",
        "vllm.v1.executor.multiproc_executor": "948c15e09617b02e",
        "vllm.v1.request": "dd7c30bf8b0894dc",
        "vllm.v1.worker.cpu.shm": "08491af8ad341399",
        "vllm.v1.worker.cpu_model_runner": "d2810a0bae395523",
        "vllm.v1.worker.gpu.model_runner": "5240fe8d62d403e4",
        "vllm.v1.worker.gpu_model_runner": "4cf95efe4ea8caa3",
        "vllm.v1.worker.gpu_worker": "e970aa29a738aa15",
        "vllm.v1.worker.xpu_worker": "7846750f1f5a5632",
    },
    "0.33.0": {
        "vllm.distributed.device_communicators.shm_broadcast": "7f253343529f09de",
        "vllm.envs": "a9f665c49da1d885",
    },
    "0.34.0": {
        "vllm.distributed.device_communicators.shm_broadcast": "3e472784cd080689",
        "vllm.envs": "c0adcef9664b3777",
    },
}
