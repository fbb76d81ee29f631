"""How tformer stores things, each concept in one module (each imports only modules above it):

    layout      where everything lives: run, sweep, checkpoint and export dirs; the only place file names are spelled
    atomic      how anything is written: one swap (a staged file or directory renamed into place) and one JSON rule
    manifest    manifest.json of checkpoints and exports: written, verified, and what its digests tell
    locate      what a `checkpoint=` argument names (a path, a run dir, the newest run, hf://...) as a local dir
    checkpoint  checkpoint save and load (safetensors + JSON/YAML, nothing unpickled)

Nothing is imported here, so `import tformer_cli.store.layout` stays as light as the module itself.
"""
