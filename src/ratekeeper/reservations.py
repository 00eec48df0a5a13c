"""``ratekeeper.nested.reservations`` under its former name, for the service's nested API.

Kept only until ``service`` imports these from ``ratekeeper.nested``; nothing else uses it.
"""

from .nested.reservations import MAX_AMOUNT as MAX_AMOUNT
from .nested.reservations import MAX_TTL as MAX_TTL
from .nested.reservations import Reservation as Reservation
from .nested.reservations import Settlement as Settlement
from .nested.reservations import restored as restored
