# Empty dependencies file for mt_common.
# This may be replaced when dependencies are built.
