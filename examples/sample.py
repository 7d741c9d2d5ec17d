"""More plane shapes, written the same way as shapes.py."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Square:
    side: float

    def area(self) -> float:
        return self.side**2

    def perimeter(self) -> float:
        return 4 * self.side


@dataclass(frozen=True)
class Ellipse:
    a: float
    b: float

    def area(self) -> float:
