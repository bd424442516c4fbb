%%% @doc Reference results of the example kernels, computed in Erlang:
%%% what the soak (kem_soak) and the eunit tests check the GPU's answers
%%% against.
-module(kem_ref).
-export([double_ref/2, glitch_ref/5]).

%% What the double kernel must return: each little-endian u32 word times 2
%% (mod 2^32), zero words past the input, cut to OutputSize bytes.
-spec double_ref(binary(), non_neg_integer()) -> binary().
double_ref(Input, OutputSize) ->
    Pad = (4 - byte_size(Input) rem 4) rem 4,
    Words = [W || <<W:32/little>> <= <<Input/binary, 0:(Pad * 8)>>],
    Doubled = << <<((W * 2) band 16#FFFFFFFF):32/little>> || W <- Words >>,
    Zeros = max(0, (OutputSize + 3) div 4 - length(Words)) * 4,
    binary:part(<<Doubled/binary, 0:(Zeros * 8)>>, 0, OutputSize).

-define(M32(X), ((X) band 16#FFFFFFFF)).

mix(V) ->
    State = ?M32(V * 747796405 + 2891336453),
    Word = ?M32(((State bsr ((State bsr 28) + 4)) bxor State) * 277803737),
    (Word bsr 22) bxor Word.

-spec glitch_ref(binary(), pos_integer(), pos_integer(), non_neg_integer(), non_neg_integer()) -> binary().
glitch_ref(Image, W, H, Seed, Strength) ->
    Px = list_to_tuple([P || <<P:32/little>> <= Image]),
    Get = fun(X, Y) -> element(Y * W + X + 1, Px) end,
    << <<(begin
            R = mix((Y div 8) bxor ?M32(Seed * 2654435761)),
            Shift = case R band 3 of 0 -> ((R bsr 2) rem max(Strength, 1)) rem W; _ -> 0 end,
            Red = Get((X + Shift) rem W, Y),
            Blue = Get((X + W - Shift) rem W, Y),
            (Red band 16#FF) bor (Get(X, Y) band 16#FF00FF00) bor (Blue band 16#FF0000)
          end):32/little>> || Y <- lists:seq(0, H - 1), X <- lists:seq(0, W - 1) >>.
