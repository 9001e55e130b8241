"""Reading the machine code: PTX, SASS, registers, spills, shared memory."""
