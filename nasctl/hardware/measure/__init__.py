"""Measuring this machine's onnxruntime CPU kernels into a `kind: lut` device (`nasctl hw profile`).

What is measured.  Runtimes do not run layers one by one: onnxruntime fuses a conv with
its batch norm and activation (and often the residual add after it) into one kernel,
keeps conv nets in a blocked channel layout (NCHWc) and converts in and out of it where
the layout ends, and wraps 3-D matrix products in reshapes.  A kernel timed alone pays
all of that plus a per-run overhead of tens of microseconds, so summing isolated
kernels overestimates a whole model 1.4-5x.  So kernels are measured *in context*:

1. `context`: random *context networks* are built from the blocks real models are made
   of, every node of a kernel carrying the kernel's tag in its name.
2. `attribution`: each network runs with onnxruntime's profiling; the per-node kernel
   times are summed per tag and go to the layers the ONNX importer reads from the
   network, exactly as `nasctl predict` reads a user's model.
3. `attribution`: each network is also timed end to end, without profiling; the run
   overhead and the profiler's own cost per node are fitted to those times.
4. `attribution`: kernels that profile longer than 0.5 ms are cut out of their network
   and timed again alone, with the thread clock.
5. `profile`: networks are measured in chunks, and a chunk whose reference networks ran
   slower than in the fastest chunk has its times scaled back.
6. `profile`: `nasctl.hardware.fit.fit_from_lut` makes the device of the kernel times;
   then `spec.yaml` and `lut.csv` are written.

`runner` holds the measuring itself - the protocol every time is taken by, profiling,
long kernels alone, chunks with reference networks, the energy counters - importing only
numpy and onnxruntime: `bundle` (`nasctl hw bundle`) copies it into a profiling bundle,
whose runner measures another machine with it, and `nasctl hw fit --bundle-results`
fits that machine's device of its results by step 6, as `hw profile` does.  `timing`
gives the protocol's functions to the rest of nasctl.
"""
