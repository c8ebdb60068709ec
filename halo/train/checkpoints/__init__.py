"""What a run leaves on disk, complete and verified or not at all (no torch to list them).

checkpoint  checkpoint folders: written once, verified by their record, found, pruned
export      Hugging Face model folders (what transformers, vLLM, SGLang load); `halo export`
joblock     one run per job folder, on any shared file system
"""
