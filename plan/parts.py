"""The ECP5 parts of the ULX3S, and how a memory takes their block RAM."""

from dataclasses import dataclass

__all__ = ["Part", "PARTS", "BLOCK_BITS", "BLOCK_GEOMETRIES", "blocks_for"]


@dataclass(frozen=True)
class Part:
    """What an LFE5U part has (Lattice's ECP5 family data sheet): LUT4s, 18 kbit block RAMs
    (DP16KD), 18×18 multipliers (MULT18X18D)."""
    name: str  # as the ULX3S names its variants: "85F"
    LUT4: int
    DP16KD: int
    MULT18X18D: int

    @property
    def device(self):
        return f"LFE5U-{self.name}"


PARTS = {part.name: part for part in (
    Part("12F", 12_288, 32, 28),
    Part("25F", 24_288, 56, 28),
    Part("45F", 43_848, 108, 72),
    Part("85F", 83_640, 208, 156),
)}

BLOCK_BITS = 18 * 1024

# A DP16KD's depth and width as a memory with one read and one write port takes it (the
# 512 × 36 one as a PDPW16KD).
BLOCK_GEOMETRIES = ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1))


def blocks_for(depth, width):
    """The block RAMs a memory of ``depth`` words of ``width`` bits takes, as Yosys maps it: in
    the arrangement that takes the fewest, where the words a block's depth leaves over go
    beside the others in its rows (``ceil(depth / D)`` words a row of ``width`` bits each, over
    blocks ``W`` bits wide): 20480 words of 8 bits are 2048 rows of 80 bits, 9 blocks of 2048 × 9."""
    return min(-(-(-(-depth // block_depth) * width) // block_width) for block_depth, block_width in BLOCK_GEOMETRIES)
