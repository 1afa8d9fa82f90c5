"""A built-in English text for quality reports (`localinfer quantize --eval` without a file):
plain prose on varied subjects, about 1,100 tokens, written for this project."""

SAMPLE_TEXT = """\
The lighthouse at the end of the northern pier was built in 1874, when the harbour still
served fishing boats and the occasional steamer carrying coal. Its keeper lived in a small stone
house at the foot of the tower and climbed the spiral stairs four times each night to wind the
clockwork that turned the lens. In winter the spray froze on the railings, and he carried a
bucket of ashes to scatter on the steps so that he would not slip on the way down.

Most people who visit the town today come for the market on Saturday mornings. Farmers from the
valley sell apples, cheese, honey and bread, and a man with a grey beard repairs bicycles under
a green umbrella. Children buy paper bags of roasted chestnuts and eat them on the wall by the
river while the gulls watch from the rooftops. By noon the stalls are folded away, the square is
swept, and the cafe on the corner puts its chairs out in the sun.

A recipe for a simple vegetable soup begins with an onion, two carrots and a stick of celery,
chopped small and softened slowly in a little olive oil. Add a clove of garlic, a handful of
lentils, a tin of tomatoes and a litre of stock, then let it simmer for half an hour until the
lentils are tender. Season with salt, pepper and a squeeze of lemon. The soup keeps well for
three days in the refrigerator and tastes better on the second day than on the first.

Water boils at one hundred degrees Celsius at sea level, but at lower temperatures on high
mountains, because the air pressure there is lower. This is why cooking pasta at a camp in the
Alps takes longer than it does at home. Pressure cookers work the other way around: by sealing
the pot and trapping the steam, they raise the pressure and therefore the boiling point, so food
cooks faster. The same physics explains why a sealed bottle of water can be carried up a hill
and crumple slightly on the way back down.

In computer programs, a list is an ordered collection of values, and a dictionary maps keys to
values. To count how often each word appears in a text, a program can split the text into words,
then walk through them one by one, adding one to the count stored under each word. Sorting the
counts from largest to smallest shows the most common words first; in English these are nearly
always short words such as the, of, and, to and a. Longer and rarer words carry most of the
meaning, which is why search engines give them more weight.

The history of timekeeping is a history of better and better oscillators. Sundials followed the
shadow of the sun, water clocks measured the flow from one vessel into another, and pendulum
clocks counted swings whose period depends only on the length of the rod. Quartz watches count
the vibrations of a tiny crystal that bends when a voltage is applied, and atomic clocks count
the oscillations of light absorbed by caesium atoms, which are so regular that such a clock
would drift by less than a second over millions of years.

She opened the letter at the kitchen table, read it twice, and put it back in its envelope. It
was from her brother, who had moved to the coast ten years earlier and rarely wrote. He said that
the garden was doing well, that the roof had finally been repaired, and that he would like her to
visit in the spring, when the almond trees were in flower. She looked out of the window at the
rain for a long time, and then she took down the calendar from its nail by the door.

To plant a tree, dig a hole twice as wide as the root ball but no deeper, so that the tree sits at
the same level as it did in its pot. Loosen the roots gently with your fingers, place the tree in
the middle of the hole, and fill it with the soil you removed, pressing it down firmly to remove
pockets of air. Water it thoroughly, and keep watering once a week through the first summer, even
when it rains, because young roots dry out quickly. A layer of mulch helps the soil stay moist.

The committee met on Tuesday to discuss the budget for the coming year. The treasurer reported
that income from membership fees had risen slightly, while the cost of heating the hall had gone
up by almost a third. After a long discussion the members agreed to hold two concerts in the
autumn to raise money, to ask the council for a small grant, and to replace the old boiler before
the winter. The next meeting will take place in the library on the first Monday of next month.
"""
