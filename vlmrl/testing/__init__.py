"""What the tests, the examples and the quick start build on, kept out of the library's core: a tiny random
Qwen2.5-VL built offline (``tiny``), the smoke mode of the GPU pipelines (``smoke``), and the imitation of a scripted
teacher that warm-starts the tool demo (``warm_start``)."""
