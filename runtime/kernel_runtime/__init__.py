"""The launch runtime every Tritonformer kernel package shares.

One copy of this folder lives in the repository (`runtime/kernel_runtime`); each kernel package
links it in as its private `_runtime` subpackage, and the build copies it into each wheel, so
`pip install` of one kernel package needs nothing else. Each package therefore imports its own
`_runtime` and keeps its own caches; the code exists once.

    compat       Triton / torch version differences and device facts
    validation   argument checks that name the argument, before any launch
    launch       Launch: a kernel's launch fixed by a plan, direct after its first call
    cache        thread-safe publish-once caches for plans and tuned choices
    tuning       triton.autotune kernels tuned once per plan, then launched through a Launch
    registration custom ops (torch.compile) and autograd Functions (eager) from one set of launchers
    dropout      Philox dropout masks: key words on the device, the keep test inside kernels

Everything here is relative-imported: the folder is imported under each package's name.
"""
