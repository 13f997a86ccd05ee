# Empty compiler generated dependencies file for mt_embedding.
# This may be replaced when dependencies are built.
